"""Built-in tools: `calculator`, arithmetic evaluated from the parse tree (never `eval`)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

from trinity.explorer.tools.base import TOOLS

MAX_EXPRESSION_CHARS = 500
# Integers past this many bits are refused: `9**9**9` would hold the interpreter (and every thread) for minutes.
MAX_INTEGER_BITS = 4096

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


@TOOLS.register("calculator")
def calculator(expression: str) -> int | float:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the expression to evaluate, e.g. "(12 + 30) * 3 / 7"
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        exact_power = isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int)
        # |left| >= 2**(bits - 1), so the power has at least right * (bits - 1) bits: refuse it before computing it.
        if exact_power and abs(left) > 1 and right * max(abs(int(left)).bit_length() - 1, 1) > MAX_INTEGER_BITS:
            raise ValueError(f"{left} ** {right} is too large")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):  # (-8) ** 0.5
            raise ValueError(f"{left} ** {right} is not a real number")
        if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
            raise ValueError(f"the result has more than {MAX_INTEGER_BITS} bits")
        return value
    shown = ast.unparse(node)
    raise ValueError(f"{shown!r} is not allowed: use numbers, + - * / // % ** and parentheses")
