"""Validation errors that name the field that is wrong."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A configuration or request value is wrong; `field` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem: `algorithm.algorithm_type: unknown 'grpoo'; known: ...`."""
    lines = []
    for problem in err.errors():
        path = ".".join(str(p) for p in (*((prefix,) if prefix else ()), *problem["loc"]))
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown field"
        message = message.removeprefix("Value error, ")
        lines.append(f"{path}: {message}" if path else message)
    return "\n".join(lines)
