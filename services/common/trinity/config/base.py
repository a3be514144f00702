"""What every config section shares: unknown keys are errors, values are immutable, names are checked."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 128 characters)")
    return value


def _check_devices(value: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """GPU indices of a service (`trainer.devices`, `explorer.devices`): each at most once, none negative."""
    if value is not None and len(set(value)) != len(value):
        raise ValueError(f"{list(value)} names a GPU more than once")
    if value is not None and min(value, default=0) < 0:
        raise ValueError(f"{list(value)}: a GPU index is 0 or more")
    return value
