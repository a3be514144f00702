"""Name -> function registries: the extension point of the algorithm library.

Every registry maps a name (the string a config uses, e.g. ``policy_loss: gspo``) to a pure function and
the default values of its hyperparameters. ``build(name, **overrides)`` returns a :class:`BoundFn`: the
function with its hyperparameters fixed, called with keyword tensors only.

Hyperparameters are declared in the decorator, not guessed from the signature, so that the set a config
may override is explicit and a typo in either place fails loudly at import or build time::

    @register_policy_loss("my_loss", clip_range=0.2)
    def my_loss(*, logprobs, old_logprobs, advantages, mask, clip_range, **_): ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError):
    """A name that no registry entry has; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: list[str], hint: str = "") -> None:
        self.kind = kind
        self.name = name
        self.known = known
        msg = f"unknown {kind} {name!r}; known {kind} names: {', '.join(known) or '(none)'}"
        self.message = f"{msg}. {hint}" if hint else msg
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would repr() the message and add quotes
        return self.message


class UnknownOverrideError(TypeError, ValueError):
    """An override that is not a hyperparameter of the named function; lists the accepted ones."""


class DuplicateNameError(ValueError):
    """A second registration under a name already taken."""


class Registry(Generic[T]):
    """A plain name -> object table with helpful lookup errors (used directly for presets)."""

    def __init__(self, kind: str, register_hint: str = "") -> None:
        self.kind = kind
        self._hint = register_hint
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T, *, replace: bool = False) -> T:
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and not replace:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is already registered; pick another name or pass replace=True"
            )
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names(), self._hint) from None

    def remove(self, name: str) -> None:
        """Drop an entry (tests that register throwaway algorithms clean up with this)."""
        self.get(name)
        del self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class RegisteredFn:
    """One registry entry: the function and its declared hyperparameter defaults."""

    name: str
    kind: str
    fn: Callable[..., Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)


class BoundFn:
    """A registered function with hyperparameters fixed; call it with the tensor inputs.

    Attributes:
        name: the registry name.
        kind: the registry kind (e.g. ``"policy loss"``).
        params: the effective hyperparameters (defaults merged with overrides), read-only.
    """

    __slots__ = ("fn", "kind", "name", "params")

    def __init__(self, entry: RegisteredFn, params: Mapping[str, Any]) -> None:
        self.name = entry.name
        self.kind = entry.kind
        self.fn = entry.fn
        self.params: Mapping[str, Any] = MappingProxyType(dict(params))

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        clash = sorted(self.params.keys() & inputs.keys())
        if clash:
            raise TypeError(
                f"{self.kind} {self.name!r}: {', '.join(clash)} are hyperparameters fixed when the "
                f"function is built; pass them as overrides when building, not at call time"
            )
        return self.fn(*args, **inputs, **self.params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"<{self.kind} {self.name}({args})>"


class FunctionRegistry(Registry[RegisteredFn]):
    """Registry of pure functions with declared, overridable hyperparameters."""

    def __init__(self, kind: str, decorator_name: str) -> None:
        super().__init__(kind, f"Register one with @{decorator_name}(name, **hyperparameter_defaults).")

    def register(self, name: str, *, replace: bool = False, **defaults: Any) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name`` with hyperparameter ``defaults``."""

        def decorator(fn: F) -> F:
            _check_declared(self.kind, name, fn, defaults)
            self.add(name, RegisteredFn(name, self.kind, fn, MappingProxyType(dict(defaults))), replace=replace)
            return fn

        return decorator

    def build(self, name: str, **overrides: Any) -> BoundFn:
        entry = self.get(name)
        unknown = sorted(set(overrides) - set(entry.defaults))
        if unknown:
            accepted = ", ".join(sorted(entry.defaults)) or "(none)"
            raise UnknownOverrideError(
                f"{self.kind} {name!r} has no hyperparameter {', '.join(map(repr, unknown))}; accepted: {accepted}"
            )
        return BoundFn(entry, {**entry.defaults, **overrides})


def _check_declared(kind: str, name: str, fn: Callable[..., Any], defaults: Mapping[str, Any]) -> None:
    """Fail at import time when a declared hyperparameter is not a keyword parameter of ``fn``."""
    params = inspect.signature(fn).parameters
    keyword_kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    missing = [k for k in defaults if k not in params or params[k].kind not in keyword_kinds]
    if missing:
        raise TypeError(
            f"{kind} {name!r}: declared hyperparameters {missing} are not keyword parameters of "
            f"{fn.__qualname__}; add them to its signature"
        )


# The library's registries. Modules register into them at import; ``trinity.algorithms`` imports them all.
ADVANTAGES = FunctionRegistry("advantage", "register_advantage")
POLICY_LOSSES = FunctionRegistry("policy loss", "register_policy_loss")
KL_ESTIMATORS = FunctionRegistry("kl estimator", "register_kl")
ENTROPY_TERMS = FunctionRegistry("entropy term", "register_entropy")
VALUE_LOSSES = FunctionRegistry("value loss", "register_value_loss")

register_advantage = ADVANTAGES.register
register_policy_loss = POLICY_LOSSES.register
register_kl = KL_ESTIMATORS.register
register_entropy = ENTROPY_TERMS.register
register_value_loss = VALUE_LOSSES.register
