"""A reward is a plain function `(response_text, task) -> float | dict[str, float]`; nothing to import."""

from __future__ import annotations

from typing import Any


def exact_match(response_text: str, task: Any) -> float:
    """1.0 when the response, stripped and case-folded, is the task's answer; else 0.0."""
    return float(response_text.strip().casefold() == task.answer.strip().casefold())
