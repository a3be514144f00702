from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trinity.models.tiny import build_tiny_llama

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random Llama (vocab 272, 2 layers, hidden 64, 4 heads / 2 KV groups, tied embeddings)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", vocab_size=272, seed=0)
