"""Model directories shared by the services: tiny random models for tests, GGUF import for real ones."""

from __future__ import annotations

import os
from pathlib import Path

BUILTIN_MODELS = ("smollm2",)


def model_cache_dir() -> Path:
    return Path(os.environ.get("TRINITY_MODEL_CACHE", Path.home() / ".cache" / "trinity" / "models"))


def resolve_model_path(path: str) -> str:
    """A model directory for `path`: built-in names are converted once into the model cache."""
    if path == "smollm2":
        from trinity.models.gguf import ensure_smollm2

        return str(ensure_smollm2(model_cache_dir()))
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"model.path: {path} is not a directory; give a Hugging Face model directory or one of {BUILTIN_MODELS}"
        )
    return path
