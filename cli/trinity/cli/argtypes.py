"""Argument types the commands share: argparse turns their ArgumentTypeError into exit 2 naming the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse
