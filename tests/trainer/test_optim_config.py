from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError
from trainer_helpers import run_config

from trinity.config import MegatronTrainerConfig, OptimizerSection, RunConfig, TorchTrainerConfig
from trinity.trainer.optim import SCHEDULES
from trinity.trainer.torch_backend import TorchBackend


def test_the_trainer_section_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="micro_batch_tokenz"):
        TorchTrainerConfig(micro_batch_tokenz=4)  # type: ignore[call-arg]


def _trainer_section(**fields: object) -> object:
    return RunConfig.model_validate({"model": {"path": "m"}, "mode": "explore", "buffer": {"taskset": {"path": "t"}},
                                     "trainer": fields}).trainer  # fmt: skip


def test_a_trainer_section_without_a_backend_is_the_torch_shape() -> None:
    trainer = _trainer_section(share_prompts=False)
    assert isinstance(trainer, TorchTrainerConfig) and not trainer.share_prompts


def test_the_backend_selects_the_shape_of_the_trainer_section() -> None:
    trainer = _trainer_section(backend="megatron", tensor_parallel_size=2)
    assert isinstance(trainer, MegatronTrainerConfig) and trainer.world_size == 2
    with pytest.raises(ValidationError, match="tensor_parallel_size"):
        _trainer_section(backend="torch", tensor_parallel_size=2)


def test_a_backend_without_a_checkpoint_dir_writes_no_periodic_checkpoints(tiny_model: Path) -> None:
    # save_interval defaults to 10 for runs (which always have a directory); a library user gets none.
    assert TorchBackend(run_config(tiny_model, save_interval=5)).trainer.save_interval == 0
    assert TorchBackend(run_config(tiny_model, save_interval=5), tiny_model.parent).trainer.save_interval == 5


def test_lora_alpha_defaults_to_twice_the_rank(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, lora_rank=4, lora_target_modules=["q_proj"]))
    lora = backend.policy.peft_config["default"]  # type: ignore[index]
    assert (lora.r, lora.lora_alpha, set(lora.target_modules)) == (4, 8.0, {"q_proj"})


def test_warmup_ramps_linearly_then_holds() -> None:
    f = SCHEDULES.get("warmup")(OptimizerSection(schedule="warmup", warmup_steps=4), 10)
    assert [f(k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_reaches_half_at_midpoint_and_the_floor_at_the_end() -> None:
    opt = OptimizerSection(schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    f = SCHEDULES.get("cosine")(opt, 12)
    assert f(0) == 0.5 and f(1) == 1.0
    assert f(2) == pytest.approx(1.0)
    assert f(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # = 0.55
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)
