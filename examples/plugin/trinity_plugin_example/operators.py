"""A buffer operator is a plain function `(experiences, ctx, **params) -> kept experiences`."""

from __future__ import annotations

from typing import Any


def drop_empty(experiences: list[Any], ctx: Any) -> list[Any]:
    """Drop experiences whose response is empty or whitespace (they teach the policy nothing)."""
    return [e for e in experiences if e.response_text.strip()]
