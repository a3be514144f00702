"""The operator registry: an operator is one function `(experiences, ctx, **params) -> kept`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trinity.config import OperatorConfig
from trinity.v1 import common_pb2


class PassRateSink(Protocol):
    def report_pass_rates(self, taskset: str, rates: dict[str, tuple[float, int]]) -> None: ...


@dataclass
class OperatorContext:
    """What an operator may reach besides the batch: where pass rates go (the task sets)."""

    pass_rates: PassRateSink | None = None


@dataclass
class OperatorResult:
    kept: list[common_pb2.Experience]
    dropped: Counter[str] = field(default_factory=Counter)


Operator = Callable[..., list[common_pb2.Experience]]
_OPERATORS: dict[str, Operator] = {}


def register_operator(name: str) -> Callable[[Operator], Operator]:
    def decorate(fn: Operator) -> Operator:
        if name in _OPERATORS:
            raise ValueError(f"operator {name!r} is already registered")
        _OPERATORS[name] = fn
        return fn

    return decorate


def known_operators() -> list[str]:
    return sorted(_OPERATORS)


def get_operator(name: str) -> Operator:
    try:
        return _OPERATORS[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}; known: {', '.join(known_operators())}") from None


def apply_operators(
    experiences: Sequence[common_pb2.Experience],
    operators: Sequence[OperatorConfig],
    ctx: OperatorContext,
) -> OperatorResult:
    """Run operators in order; whatever an operator removes is counted under its name."""
    kept = list(experiences)
    dropped: Counter[str] = Counter()
    for spec in operators:
        fn = get_operator(spec.name)
        before = len(kept)
        kept = fn(kept, ctx, **spec.params, **spec.options)
        if len(kept) < before:
            dropped[spec.name] += before - len(kept)
    return OperatorResult(kept=kept, dropped=dropped)


def validate_operator(spec: OperatorConfig) -> None:
    """Fail at stream creation, not at the first Put, when params do not fit the operator."""
    import inspect

    fn = get_operator(spec.name)
    try:
        inspect.signature(fn).bind([], OperatorContext(), **spec.params, **spec.options)
    except TypeError as err:
        raise ValueError(f"operator {spec.name!r}: {err}") from None
