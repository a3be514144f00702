"""Name -> function registries: the extension point of the algorithm library.

Every registry maps a name (the string a config uses, e.g. ``policy_loss: gspo``) to a pure function and
the default values of its hyperparameters. ``build(name, **overrides)`` returns a :class:`BoundFn`: the
function with its hyperparameters fixed, called with keyword tensors only.

A function declares everything it reads in its signature: its hyperparameters (declared with their defaults in
``trinity.algorithm_table`` for a built-in, in the decorator for a plugin's) and its inputs; a ``**kwargs``
catch-all is refused, so an input the trainer does not supply is an error, never silently ignored::

    @register_policy_loss("my_loss", clip_range=0.2)
    def my_loss(*, logprobs, old_logprobs, advantages, mask, clip_range): ...

The trainer hands a function exactly the inputs it names (``BoundFn.inputs``). These are
:class:`trinity.registry.Registry` instances: built-in names load their module on first use
(``trinity.registry_names``), and a package adds names through the entry-point groups
``trinity.policy_losses``, ``trinity.advantages``, ... (see examples/plugin).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from trinity.algorithm_table import FUNCTIONS
from trinity.registry import DuplicateNameError, Registry, UnknownNameError

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["BoundFn", "DuplicateNameError", "FunctionRegistry", "UnknownNameError", "UnknownOverrideError"]


class UnknownOverrideError(TypeError, ValueError):
    """An override that is not a hyperparameter of the named function; lists the accepted ones."""


class BoundFn:
    """A registered function with hyperparameters fixed; call it with the tensor inputs.

    Attributes:
        name: the registry name.
        kind: the registry kind (e.g. ``"policy loss"``).
        params: the effective hyperparameters (defaults merged with overrides), read-only.
        inputs: the inputs the function reads, each mapped to whether it must be given.
    """

    __slots__ = ("fn", "inputs", "kind", "name", "params")

    def __init__(self, name: str, kind: str, fn: Callable[..., Any], params: Mapping[str, Any]) -> None:
        self.name = name
        self.kind = kind
        self.fn = fn
        self.params: Mapping[str, Any] = MappingProxyType(dict(params))
        self.inputs: Mapping[str, bool] = MappingProxyType(
            {
                p.name: p.default is inspect.Parameter.empty
                for p in inspect.signature(fn).parameters.values()
                if p.name not in self.params
            }
        )

    def given(self, available: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs of ``available`` (None = not available) that this function reads; a ValueError naming the
        first input it must have and ``available`` lacks."""
        missing = [k for k, required in self.inputs.items() if required and available.get(k) is None]
        if missing:
            raise ValueError(f"{self.kind} {self.name!r} needs {', '.join(missing)}, which this batch lacks")
        return {k: available[k] for k in self.inputs if available.get(k) is not None}

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


class FunctionRegistry(Registry[Callable[..., Any]]):
    """Registry of pure functions with declared, overridable hyperparameters."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._defaults: dict[str, Mapping[str, Any]] = {}

    def register(self, name: str, **defaults: Any) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name`` with hyperparameter ``defaults`` (a built-in's come from
        ``trinity.algorithm_table``)."""
        add = super().register(name)
        builtin = FUNCTIONS.get((self.kind, name))  # type: ignore[arg-type]
        if builtin is not None:
            if defaults:
                raise TypeError(
                    f"{self.label} {name!r}: a built-in declares its hyperparameters in the algorithm table"
                )
            defaults = dict(builtin.params)

        def decorator(fn: F) -> F:
            if name not in self._entries:  # else `add` refuses the second registration
                _check_declared(self.label, name, fn, defaults)
            add(fn)
            self._defaults[name] = MappingProxyType(dict(defaults))
            return fn

        return decorator

    def defaults(self, name: str) -> Mapping[str, Any]:
        """The declared hyperparameters of ``name`` and their default values (read-only)."""
        self.get(name)
        return self._defaults[name]

    def build(self, name: str, **overrides: Any) -> BoundFn:
        fn, defaults = self.get(name), self.defaults(name)
        unknown = sorted(set(overrides) - set(defaults))
        if unknown:
            accepted = ", ".join(sorted(defaults)) or "(none)"
            raise UnknownOverrideError(
                f"{self.label} {name!r} has no hyperparameter {', '.join(map(repr, unknown))}; accepted: {accepted}"
            )
        return BoundFn(name, self.label, fn, {**defaults, **overrides})


def _check_declared(kind: str, name: str, fn: Callable[..., Any], defaults: Mapping[str, Any]) -> None:
    """Fail at import time when a declared hyperparameter is not a keyword parameter of ``fn``."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise TypeError(
            f"{kind} {name!r}: {fn.__qualname__} takes **kwargs; name every input it reads instead, so that one the "
            "trainer does not supply fails loudly"
        )
    keyword_kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    missing = [k for k in defaults if k not in params or params[k].kind not in keyword_kinds]
    if missing:
        raise TypeError(
            f"{kind} {name!r}: declared hyperparameters {missing} are not keyword parameters of "
            f"{fn.__qualname__}; add them to its signature"
        )


# The library's registries; each name's module is imported the first time the name is looked up.
ADVANTAGES = FunctionRegistry("advantage")
POLICY_LOSSES = FunctionRegistry("policy_loss")
KL_ESTIMATORS = FunctionRegistry("kl_estimator")
ENTROPY_TERMS = FunctionRegistry("entropy_term")
VALUE_LOSSES = FunctionRegistry("value_loss")

register_advantage = ADVANTAGES.register
register_policy_loss = POLICY_LOSSES.register
register_kl = KL_ESTIMATORS.register
register_entropy = ENTROPY_TERMS.register
register_value_loss = VALUE_LOSSES.register
