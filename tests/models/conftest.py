"""A tiny random model of every supported family (`trinity.models.tiny.FAMILIES`), built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trinity.models.tiny import FAMILIES, build_tiny_model

os.environ.setdefault("OMP_NUM_THREADS", "1")

# head_dim 64 (hidden 128 / 2 heads): one vLLM's CPU attention supports. Untied where a family allows it, so that
# `lm_head` is a weight of its own to sync (Gemma always ties it).
SIZES = {"vocab_size": 320, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "num_kv_heads": 1}


@pytest.fixture(scope="session", params=FAMILIES)
def family_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family = request.param
    return build_tiny_model(tmp_path_factory.mktemp(family) / "model", family, tie_word_embeddings=False, **SIZES)
