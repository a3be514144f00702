"""Answer-checking rewards: `math` (symbolic equivalence), `accuracy` (exact text or last number)."""

from __future__ import annotations

import re

from trinity.explorer.rewards.base import REWARDS
from trinity.v1 import common_pb2

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` in `text` (balanced braces), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def extract_last_number(text: str) -> str | None:
    """The last number in `text` without thousands separators, or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def extract_answer(text: str) -> str | None:
    """A boxed answer if there is one, else the last number."""
    return extract_boxed(text) or extract_last_number(text)


def _numbers_equal(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
    except ValueError:
        return False


def answer_matches(response_text: str, answer: str) -> bool:
    """The response's extracted answer equals `answer` (as text or as a number)."""
    gold = answer.strip()
    got = extract_answer(response_text)
    if got is None:
        return False
    if got == gold:
        return True
    gold_number = extract_last_number(gold)
    return gold_number is not None and _numbers_equal(got, gold_number)


@REWARDS.register("accuracy")
def accuracy_reward(response_text: str, task: common_pb2.Task) -> float:
    """1.0 if the extracted answer equals `task.answer` (as text or as a number), else 0.0."""
    return 1.0 if answer_matches(response_text, task.answer) else 0.0


@REWARDS.register("math")
def math_reward(response_text: str, task: common_pb2.Task) -> float:
    r"""1.0 if the response's answer is mathematically equivalent to `task.answer` (math-verify).

    The response is searched for `\boxed{}` / LaTeX and plain expressions, like math-verify's
    defaults; falls back to `accuracy` when math-verify cannot parse either side.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify's own timeouts use SIGALRM, which only works in the main thread;
    # `evaluate_reward` bounds the time instead.
    gold_text = task.answer if "$" in task.answer or "\\" in task.answer else f"${task.answer}$"
    gold = parse(gold_text, parsing_timeout=None)
    if not gold:
        gold = parse(task.answer, extraction_config=[ExprExtractionConfig()], parsing_timeout=None)
    answer = parse(
        response_text,
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,
    )
    if not gold or not answer:
        return 1.0 if answer_matches(response_text, task.answer) else 0.0  # the `accuracy` rule
    return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0
