"""Data operators: the steps between raw and trainable experiences, configured by name on a stream."""

from trinity.buffer.operators import builtin as _builtin  # noqa: F401  (registers the built-in operators)
from trinity.buffer.operators.registry import (
    OperatorContext,
    OperatorResult,
    apply_operators,
    known_operators,
    register_operator,
)

__all__ = ["OperatorContext", "OperatorResult", "apply_operators", "known_operators", "register_operator"]
