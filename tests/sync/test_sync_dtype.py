"""Which dtype travels: the explorer's engine dtype, decided once on the run config, and the cast before the wire."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.conftest import tiny_config
from trinity.config import RunConfig
from trinity.sync import narrowed_to


def _config(tmp_path, **overrides) -> RunConfig:
    return RunConfig.model_validate(tiny_config(tmp_path / "model", **overrides))


def test_the_engine_dtype_is_the_model_dtype_when_the_engine_sets_none(tmp_path):
    assert _config(tmp_path, **{"model.dtype": "bfloat16"}).engine_dtype == "bfloat16"
    assert _config(tmp_path).engine_dtype == "float32"


@pytest.mark.parametrize("engine", ["vllm", "transformers"])
def test_the_engine_options_dtype_overrides_the_model_dtype(tmp_path, engine):
    config = _config(tmp_path, **{"explorer.engine": engine, "explorer.engine_options": {"dtype": "bfloat16"}})
    assert config.model.dtype == "float32"
    assert config.engine_dtype == "bfloat16"


def test_wider_floating_weights_are_cast_to_the_engine_dtype():
    weight = torch.randn(4, 8)
    [(name, sent)] = narrowed_to([("w", weight)], torch.bfloat16)
    assert name == "w" and sent.dtype == torch.bfloat16 and torch.equal(sent, weight.to(torch.bfloat16))


def test_narrower_weights_are_never_widened_and_integers_pass_unchanged():
    """bf16 weights bound for an fp32 engine stay bf16 (the engine widens them exactly, at half the bytes)."""
    bf16, ids = torch.randn(4, 8).to(torch.bfloat16), torch.arange(6)
    sent = dict(narrowed_to([("bf16", bf16), ("ids", ids)], torch.float32))
    assert sent["bf16"] is bf16 and sent["ids"] is ids


def test_weights_already_in_the_engine_dtype_are_sent_without_a_copy():
    weight = torch.randn(4, 8)
    [(_, sent)] = narrowed_to([("w", weight)], torch.float32)
    assert sent is weight
