"""Where the console listens and what it dials, from `TRINITY_*` variables (docs/console.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trinity.runtime.settings import auth_token

DEFAULT_PORT = 8300


def _examples_dir() -> Path | None:
    """`examples/` of a source checkout (this file is services/console/trinity/console/settings.py)."""
    candidate = Path(__file__).resolve().parents[4] / "examples"
    return candidate if candidate.is_dir() else None


@dataclass(frozen=True)
class ConsoleSettings:
    gateway: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None  # the console's own API requires it too; passed on to the gateway and buffer
    examples_dir: Path | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> ConsoleSettings:
        examples = os.environ.get("TRINITY_CONSOLE_EXAMPLES")
        values: dict[str, object] = {
            "gateway": os.environ.get("TRINITY_GATEWAY", cls.gateway),
            "host": os.environ.get("TRINITY_CONSOLE_HOST", cls.host),
            "port": int(os.environ.get("TRINITY_CONSOLE_PORT", str(DEFAULT_PORT))),
            "token": auth_token(),
            "examples_dir": Path(examples) if examples else _examples_dir(),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
