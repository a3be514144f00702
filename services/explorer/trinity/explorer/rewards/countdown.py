"""The `countdown` reward: an arithmetic expression over the given numbers that hits the target.

The expression is parsed with `ast` and evaluated by a walker that knows only numbers, + - * /
and parentheses: no `eval`, no names, no calls, no powers (so no huge intermediates).
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction

from trinity.explorer.rewards.base import REWARDS
from trinity.explorer.rewards.format import extract_tag
from trinity.v1 import common_pb2

FORMAT_SCORE = 0.1  # a well-formed equation that misses the target or misuses the numbers
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CANDIDATE = re.compile(r"[\d\s+\-*/().]*\d[\d\s+\-*/().]*")
MAX_EXPRESSION_CHARS = 200


class UnsafeExpression(ValueError):
    """The text is not a plain arithmetic expression over integer literals."""


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of `expression` and the integer literals it uses; raises on anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise UnsafeExpression(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"not an expression: {e.msg}") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise UnsafeExpression(f"{type(node).__name__} is not allowed")

    return walk(tree.body), used


def extract_equation(text: str) -> str | None:
    """The equation in `<answer>` if present, else the last arithmetic run in the text; `= x` dropped."""
    body = extract_tag(text, "answer")
    if body is None:
        runs = [r.strip() for r in _CANDIDATE.findall(text) if any(op in r for op in "+-*/")]
        body = runs[-1] if runs else None
    return body.split("=")[0].strip() if body else None


def countdown_numbers(task: common_pb2.Task) -> tuple[list[int], int]:
    """`(numbers, target)` from the task payload (`numbers` or `nums`, and `target`)."""
    fields = task.payload.fields
    key = "numbers" if "numbers" in fields else "nums"
    if key not in fields or "target" not in fields:
        raise KeyError("countdown task payload needs 'numbers' (or 'nums') and 'target'")
    numbers = [int(v.number_value) for v in fields[key].list_value.values]
    return numbers, int(fields["target"].number_value)


@REWARDS.register("countdown")
def countdown_reward(response_text: str, task: common_pb2.Task) -> float:
    """1.0 if the equation uses each given number exactly once and equals the target, else 0.1 or 0."""
    numbers, target = countdown_numbers(task)
    equation = extract_equation(response_text)
    if equation is None:
        return 0.0
    try:
        value, used = evaluate_expression(equation)
    except (UnsafeExpression, ZeroDivisionError):
        return 0.0
    if Counter(used) == Counter(numbers) and value == target:
        return 1.0
    return FORMAT_SCORE
