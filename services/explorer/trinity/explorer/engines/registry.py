"""The engine registry: configs name an engine (`vllm`, `transformers`, `scripted`)."""

from __future__ import annotations

from typing import Any

from trinity.explorer.engines.base import Engine
from trinity.registry import Registry

ENGINES: Registry[type[Engine]] = Registry("engine")


def create_engine(name: str, **config: Any) -> Engine:
    """Build the engine registered as `name` with its config fields as keyword arguments.

    Each engine's module is imported on first use, so vLLM is imported only when its engine is built.
    """
    return ENGINES.get(name)(**config)
