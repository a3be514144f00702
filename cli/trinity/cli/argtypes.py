"""Argument types the commands share: argparse turns their ArgumentTypeError into exit 2 naming the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(kind: type[int] | type[float], text: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None


def positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(kind, text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(_number(int, text))
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {text}")
        return value

    return parse
