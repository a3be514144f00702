"""Data operators: the steps between raw and trainable experiences, configured by name on a stream."""

from trinity.buffer.operators.registry import (
    OPERATORS,
    OperatorContext,
    OperatorResult,
    apply_operators,
    register_operator,
)

__all__ = ["OPERATORS", "OperatorContext", "OperatorResult", "apply_operators", "register_operator"]
