"""Shared fixtures: tiny random Llamas and ONE vLLM engine for the whole session (start ~2-6 s)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path

import pytest

# head_dim must be one vLLM's CPU attention supports (16 is not; 64 is): hidden 128 / 2 heads.
TINY = {"vocab_size": 320, "hidden_size": 128, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 256}


def build_model(path: Path, seed: int, proj_scale: float) -> Path:
    """A tiny Llama whose projection weights are scaled up.

    At the default init a tiny tied-embedding model just repeats the prompt's last token whatever
    its weights (the residual stream dominates), so two seeds give identical greedy text; scaling
    the attention / MLP projections makes the output depend on the weights.
    """
    from safetensors.torch import load_file, save_file

    from trinity.models.tiny import build_tiny_llama

    out = build_tiny_llama(path, seed=seed, **TINY)
    weights = load_file(str(out / "model.safetensors"))
    scaled = {k: (v * proj_scale if k.endswith("proj.weight") else v).contiguous() for k, v in weights.items()}
    save_file(scaled, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny_a"), seed=0, proj_scale=4.0)


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, different weights (the 'trained' model of weight-sync tests)."""
    return build_model(tmp_path_factory.mktemp("tiny_b"), seed=1, proj_scale=8.0)


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir: Path):
    from trinity.explorer.engines import create_engine

    # A quarter GiB of KV cache: more than the tests use, and a fraction `VLLM_CPU_KVCACHE_SPACE` could not set;
    # 32-token blocks, the quickstart's.
    engine = create_engine("vllm", model_path=str(tiny_model_dir), seed=0, kv_cache_space_gib=0.25, block_size=32)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_engine(tiny_model_dir: Path):
    from trinity.explorer.engines import create_engine

    engine = create_engine("transformers", model_path=str(tiny_model_dir), seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path):
    """An independent fp32 Hugging Face copy of the tiny model, for recomputing log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
