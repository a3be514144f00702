from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trinity.models.tiny import build_tiny_llama

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (vocab 272, 2 layers, hidden 64) shared read-only by the trainer tests."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", vocab_size=272, seed=0)
