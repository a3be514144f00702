"""`trinity check --gpus N --gpu-memory-gib M`: each process's GPU memory and a layout, against hand computations.

The model of every case: hidden 1024, 2 layers, 8 heads of 128, 2 KV heads, MLP 4096, vocabulary 32000, untied.
  per layer: q 1024*1024 = 1,048,576; k, v 1024*256 = 262,144 each; o 1,048,576        -> attention 2,621,440
             MLP 3*1024*4096 = 12,582,912; two norms 2*1024 = 2,048                    -> layer 15,206,400
  embeddings and lm_head 2*32000*1024 = 65,536,000; 2 layers 30,412,800; final norm 1,024
  parameters P = 95,949,824
The run: micro_batch_tokens 1000, logprob_chunk_size 500, kl_coef 0 (no reference model), GPU defaults (bf16 weights
with fp32 master weights: 4 bytes a parameter; the engine in bf16), prompts 512 + responses 128 tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_check import Done
from tests.cli.test_check import trinity as trinity  # the fixture, shared
from trinity.cli.layout import GIB, Layout, ModelShape, engine_memory, suggest, trainer_rank_memory
from trinity.config import ConfigError, RunConfig

SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 4096,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
P = 95_949_824


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(SHAPE))
    return tmp_path / "model"


def _run(model: Path, trainer: dict[str, Any] | None = None, dtype: str = "float32", **more: Any) -> RunConfig:
    trainer = trainer or {}
    megatron = trainer.get("backend") == "megatron"
    return RunConfig.model_validate(
        {
            "model": {"path": str(model), "dtype": dtype},
            "buffer": {"taskset": {"path": "t.jsonl"}},
            "algorithm": {"kl_coef": 0.0},
            "trainer": {"micro_batch_tokens": 1000, **({} if megatron else {"logprob_chunk_size": 500}), **trainer},
            **more,
        }
    )


def test_the_parameters_are_counted_from_config_json(model: Path) -> None:
    assert ModelShape.read(str(model)).parameters == P


def test_a_mixture_of_experts_counts_every_expert_and_the_router(tmp_path: Path) -> None:
    # 4 experts of MLP 512: 4*3*1024*512 + router 1024*4 = 6,295,552 per layer instead of 12,582,912.
    (tmp_path / "config.json").write_text(json.dumps({**SHAPE, "num_experts": 4, "moe_intermediate_size": 512}))
    assert ModelShape.read(str(tmp_path)).parameters == P - 2 * (12_582_912 - 6_295_552)


def test_a_config_json_without_the_shape_names_the_model_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "clip"}))
    with pytest.raises(ConfigError, match=r"model.path: .* has no hidden_size"):
        ModelShape.read(str(tmp_path))


def test_a_torch_rank_holds_its_share_of_weights_gradients_and_moments(model: Path) -> None:
    memory = trainer_rank_memory(_run(model), ModelShape.read(str(model)), data_parallel=2, tensor_parallel=1)
    assert memory.terms == {
        "weights": P * 4 / 2,  # 191,899,648
        "gradients": P * 4 / 2,
        "optimizer": 2 * P * 4 / 2,  # AdamW's two moments
        "activations": 2 * 1000 * 1024 * (10 + 24) * 2,  # 2 layers x tokens x hidden x 34 x 2 bytes = 139,264,000
        "logits": 2 * 500 * 32000 * 4,  # two fp32 [chunk, vocab] = 128,000,000
    }


def test_a_reference_model_adds_its_weights_and_checkpointing_keeps_one_layer(model: Path) -> None:
    config = _run(model, {"gradient_checkpointing": True}, algorithm={"kl_coef": 0.1})
    memory = trainer_rank_memory(config, ModelShape.read(str(model)), data_parallel=1, tensor_parallel=1)
    assert memory.terms["reference"] == P * 4
    # one layer's 1000*1024*34*2 = 69,632,000, plus each layer's input 2*1000*1024*2 = 4,096,000
    assert memory.terms["activations"] == 69_632_000 + 4_096_000


def test_without_master_weights_a_rank_keeps_bf16(model: Path) -> None:
    config = _run(model, {"fp32_master_weights": False})
    memory = trainer_rank_memory(config, ModelShape.read(str(model)), data_parallel=1, tensor_parallel=1)
    assert (memory.terms["weights"], memory.terms["optimizer"]) == (P * 2, 2 * P * 2)


def test_a_megatron_rank_splits_over_tensor_parallel_ranks(model: Path) -> None:
    config = _run(model, {"backend": "megatron", "tensor_parallel_size": 2}, dtype="bfloat16")
    terms = trainer_rank_memory(config, ModelShape.read(str(model)), data_parallel=1, tensor_parallel=2).terms
    # bf16 weights 2 bytes, fp32 gradients 4, fp32 master copy 4 + two moments 8: over 2 ranks
    assert (terms["weights"], terms["gradients"], terms["optimizer"]) == (P * 2 / 2, P * 4 / 2, P * 12 / 2)
    assert terms["activations"] == 2 * 1000 * 1024 * (10 + 24 / 2) * 2
    assert terms["logits"] == 2 * 1000 * 32000 * 4 / 2  # the whole micro-batch's logits, vocab split over TP


def test_an_engine_holds_bf16_weights_and_the_kv_cache_of_its_sequences(model: Path) -> None:
    memory = engine_memory(_run(model), ModelShape.read(str(model)), tensor_parallel=1, gpu_bytes=GIB)
    # KV: 2 (k, v) x 2 layers x 2 heads x 128 x 2 bytes = 2,048 bytes a token, x 640 tokens = 1,310,720
    assert (memory.weights, memory.kv_one_sequence) == (P * 2, 1_310_720)
    assert memory.sequences == 32 * 2  # max_concurrent_rollouts x grpo's group size
    # (0.9 GiB - 191,899,648) / 1,310,720 = 590.8 sequences
    assert memory.sequences_held == 590


def test_the_trainer_gets_the_fewest_gpus_it_fits_on_and_explorers_the_rest(model: Path) -> None:
    # A 1 GiB GPU, 0.9 usable = 966,367,641.6 bytes. Trainer states 4 x 383,799,296 = 1,535,197,184 over dp ranks,
    # plus 139,264,000 + 128,000,000: dp 2 needs 1,034,862,592 (too much), dp 3 778,996,394.7. Engine: 191,899,648 +
    # 1,310,720 within vLLM's 0.9 GiB at TP 1. Five explorers on the five GPUs left.
    layout = suggest(_run(model), ModelShape.read(str(model)), gpus=8, gpu_bytes=GIB)
    assert layout == Layout(3, 1, 1, 5, (0, 1, 2), (3, 4, 5, 6, 7))


def test_with_no_gpu_left_the_explorer_shares_the_trainers_where_checkpointing_makes_room(model: Path) -> None:
    # 3 GPUs: dp 3 leaves 966,367,641.6 - 778,996,394.7 = 187,371,246.9 beside the trainer, under the engine's
    # 193,210,368. Checkpointed, activations are 73,728,000: the rank needs 713,460,394.7 and leaves 252,907,246.9,
    # 23.55 % of the GPU.
    layout = suggest(_run(model), ModelShape.read(str(model)), gpus=3, gpu_bytes=GIB)
    assert layout == Layout(3, 1, 1, 1, (0, 1, 2), (0,), colocate_utilization=0.23, gradient_checkpointing=True)


def test_a_run_that_cannot_fit_says_why(model: Path) -> None:
    # 2 GPUs: dp 2 checkpointed needs 767,598,592 + 73,728,000 + 128,000,000 = 969,326,592 > 966,367,641.6.
    layout = suggest(_run(model), ModelShape.read(str(model)), gpus=2, gpu_bytes=GIB)
    assert layout.reason == "the trainer does not fit on 2 GPU(s) of 1 GiB at any split"


def _config_file(model: Path) -> Path:
    path = model.parent / "run.yaml"
    tasks = model.parent / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    config = {
        "model": {"path": str(model)},
        "buffer": {"taskset": {"path": str(tasks)}},
        "algorithm": {"kl_coef": 0.0},
        "trainer": {"micro_batch_tokens": 1000, "logprob_chunk_size": 500},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_check_prints_the_layout_as_comments_after_the_run(trinity: Callable[..., Done], model: Path) -> None:
    done = trinity("check", "--config", str(_config_file(model)), "--gpus", "8", "--gpu-memory-gib", "1")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["config"]["model"]["path"] == str(model)  # still one YAML document
    assert "# suggested: trainer.data_parallel_size 3, trainer.devices [0, 1, 2], explorer tensor parallel 1, " in (
        done.stdout
    )


def test_check_exits_1_when_the_run_cannot_fit(trinity: Callable[..., Done], model: Path) -> None:
    done = trinity("check", "--config", str(_config_file(model)), "--gpus", "2", "--gpu-memory-gib", "1")
    assert done.returncode == 1
    assert "# cannot fit: the trainer does not fit on 2 GPU(s)" in done.stdout


def test_check_needs_both_machine_flags(trinity: Callable[..., Done], model: Path) -> None:
    done = trinity("check", "--config", str(_config_file(model)), "--gpus", "8")
    assert done.returncode == 2
    assert "--gpu-memory-gib: the layout needs both flags" in done.stderr
