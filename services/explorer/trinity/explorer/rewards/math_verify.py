r"""The `math_verify` reward: the response's final answer equals `task.answer` mathematically (Hugging Face's
math-verify), for GSM8K and MATH answers alike; `final_answer` says whether the response gives a final answer at
all (`math_verify_format`, in `composite`, weighs the two 0.9 / 0.1 like `math_format`).

Both sides are cut to their final answer and normalized the same way before math-verify parses them:

- the final answer: the last `\boxed{...}`, else the text after the last `####` (GSM8K) up to the line's end,
  else the last `<answer>...</answer>`; a gold answer with none of them is used whole. A response with none is
  searched by math-verify itself (its "final answer is" anchors, the last LaTeX or plain expression) in its last
  `MAX_SEARCHED_CHARS` characters;
- thousands separators go (`1,000`, `1{,}000`, `1\,000` -> 1000); so do dollar signs (`$5`, `\$5`, `$x$`),
  percent signs (`10%` -> 10) and plain-text units after a number (`5 cm`, `42 dollars` -> 5, 42; LaTeX units such
  as `5\text{ cm}` are math-verify's to drop);
- the rest is parsed as LaTeX (`\frac12`, `\sqrt{2}/2`, `0.5`), else as a plain expression (`1/2`).

Two answers math-verify cannot parse count as equal when their normalized texts are. math-verify's own time limits
use SIGALRM, which works only in a process's main thread, and the explorer scores in worker threads: they are off
(`parsing_timeout=None`, `timeout_seconds=None`), and `evaluate_reward` bounds the time instead.
"""

from __future__ import annotations

import re

from trinity.explorer.rewards.base import REWARDS
from trinity.explorer.rewards.format import extract_tag
from trinity.explorer.rewards.math import extract_boxed
from trinity.v1 import common_pb2

MAX_SEARCHED_CHARS = 2000  # of a response without a final answer, the tail math-verify searches
_GSM8K_ANSWER = re.compile(r"####[ \t]*([^\n]*)")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:,|\{,\}|\\,)\d{3})+(?![\d])")
_THOUSANDS_SEPARATOR = re.compile(r",|\{,\}|\\,")
_NUMBER_WITH_UNIT = re.compile(r"([-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:/\d+)?)\s*(?!pi\b)[A-Za-z]{2,}[A-Za-z\s.]*")


def final_answer_text(text: str) -> str | None:
    r"""The last `\boxed{}`'s content, else what follows the last `####` on its line, else the last `<answer>`."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    gsm8k = _GSM8K_ANSWER.findall(text)
    if gsm8k:
        return str(gsm8k[-1]).strip()
    return extract_tag(text, "answer")


def normalize_answer(answer: str) -> str:
    """A final answer without thousands separators, dollar and percent signs, plain-text units or a final period."""
    text = answer.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").strip()
    text = _THOUSANDS.sub(lambda m: _THOUSANDS_SEPARATOR.sub("", m.group()), text)
    text = text.rstrip(".").strip()
    unit = _NUMBER_WITH_UNIT.fullmatch(text)
    return unit.group(1) if unit and "\\" not in text else text


def parse_answer(answer: str) -> list[object]:
    """math-verify's parse of a normalized final answer: as LaTeX, else as a plain expression; [] if neither."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if not answer:
        return []
    latex = parse(f"${answer}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    if latex:
        return list(latex)
    return list(parse(answer, extraction_config=[ExprExtractionConfig()], parsing_timeout=None))


def search_answer(text: str) -> list[object]:
    """math-verify's own search of a response that gives no final answer (its tail only)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    tail = text[-MAX_SEARCHED_CHARS:]
    return list(parse(tail, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None))


def answers_equal(response_text: str, gold_answer: str) -> bool:
    """The response's final answer equals the gold one (either may be a whole solution) after normalizing."""
    from math_verify import verify

    gold_text = normalize_answer(final_answer_text(gold_answer) or gold_answer)
    gold = parse_answer(gold_text)
    given = final_answer_text(response_text)
    if given is None:
        return bool(gold) and verify(gold, search_answer(response_text), timeout_seconds=None)
    given_text = normalize_answer(given)
    if gold_text and given_text == gold_text:
        return True
    return bool(gold) and verify(gold, parse_answer(given_text), timeout_seconds=None)


@REWARDS.register("math_verify")
def math_verify_reward(response_text: str, task: common_pb2.Task) -> float:
    r"""1.0 if the response's final answer (`\boxed{}`, `#### x`, ...) equals `task.answer` by math-verify, else 0."""
    return 1.0 if answers_equal(response_text, task.answer) else 0.0


@REWARDS.register("final_answer")
def final_answer_reward(response_text: str, task: common_pb2.Task) -> float:
    r"""1.0 if the response states a final answer as `\boxed{...}` or `#### ...` (not empty), else 0."""
    boxed = extract_boxed(response_text)
    if boxed is None:
        found = _GSM8K_ANSWER.findall(response_text)
        boxed = str(found[-1]) if found else None
    return 1.0 if boxed is not None and boxed.strip() else 0.0
