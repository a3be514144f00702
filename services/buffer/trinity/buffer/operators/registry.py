"""The operator registry: an operator is one function `(experiences, ctx, **params) -> kept`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trinity.config import OperatorConfig
from trinity.registry import Registry
from trinity.v1 import common_pb2


@dataclass
class OperatorContext:
    """What an operator may reach besides the batch: nothing yet; the slot keeps the operator signature stable."""


@dataclass
class OperatorResult:
    kept: list[common_pb2.Experience]
    dropped: Counter[str] = field(default_factory=Counter)


Operator = Callable[..., list[common_pb2.Experience]]
OPERATORS: Registry[Operator] = Registry("operator")
register_operator = OPERATORS.register


def apply_operators(
    experiences: Sequence[common_pb2.Experience],
    operators: Sequence[OperatorConfig],
    ctx: OperatorContext,
) -> OperatorResult:
    """Run operators in order; whatever an operator removes is counted under its name."""
    kept = list(experiences)
    dropped: Counter[str] = Counter()
    for spec in operators:
        fn = OPERATORS.get(spec.name)
        before = len(kept)
        kept = fn(kept, ctx, **spec.params, **spec.options)
        if len(kept) < before:
            dropped[spec.name] += before - len(kept)
    return OperatorResult(kept=kept, dropped=dropped)


def validate_operator(spec: OperatorConfig) -> None:
    """Fail at stream creation, not at the first Put, when params do not fit the operator."""
    import inspect

    fn = OPERATORS.get(spec.name)
    try:
        inspect.signature(fn).bind([], OperatorContext(), **spec.params, **spec.options)
    except TypeError as err:
        raise ValueError(f"operator {spec.name!r}: {err}") from None
