"""The engine registry: configs name an engine (`vllm`, `transformers`, `scripted`)."""

from __future__ import annotations

from typing import Any

from trinity.explorer.engines.base import Engine
from trinity.explorer.registry import Registry

ENGINES: Registry[type[Engine]] = Registry("engine")


def create_engine(name: str, **config: Any) -> Engine:
    """Build the engine registered as `name` with its config fields as keyword arguments."""
    _import_builtins()
    return ENGINES.get(name)(**config)


def _import_builtins() -> None:
    # Imported on demand: each module registers itself, and vLLM is only imported when its engine is built.
    from trinity.explorer.engines import hf_engine, scripted, vllm_engine  # noqa: F401
