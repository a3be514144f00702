"""Rollout engines behind one contract (`Engine`), chosen by registry name."""

from trinity.explorer.engines.base import (
    Engine,
    GenerationRequest,
    GenerationResult,
    Sample,
    SamplingSettings,
    iter_safetensors_dir,
)
from trinity.explorer.engines.registry import ENGINES, create_engine

__all__ = [
    "ENGINES",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "Sample",
    "SamplingSettings",
    "create_engine",
    "iter_safetensors_dir",
]
