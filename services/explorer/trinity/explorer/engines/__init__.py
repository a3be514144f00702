"""Rollout engines behind one contract (`Engine`), chosen by registry name."""

from trinity.explorer.engines.base import (
    Engine,
    GenerationRequest,
    GenerationResult,
    GenerationStream,
    GenerationTimeout,
    Sample,
    SampleDelta,
    SamplingSettings,
    deadline,
    iter_safetensors_dir,
)
from trinity.explorer.engines.registry import ENGINES, create_engine

__all__ = [
    "ENGINES",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStream",
    "GenerationTimeout",
    "Sample",
    "SampleDelta",
    "SamplingSettings",
    "create_engine",
    "deadline",
    "iter_safetensors_dir",
]
