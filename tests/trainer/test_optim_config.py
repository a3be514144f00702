from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from trinity.trainer.config import OptimizerSettings, TrainerSettings
from trinity.trainer.optim import SCHEDULES


def test_settings_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="micro_batch_tokenz"):
        TrainerSettings(model_path="m", micro_batch_tokenz=4)  # type: ignore[call-arg]


def test_save_interval_needs_a_checkpoint_dir() -> None:
    with pytest.raises(ValidationError, match="checkpoint_dir"):
        TrainerSettings(model_path="m", save_interval=5)


def test_warmup_ramps_linearly_then_holds() -> None:
    f = SCHEDULES["warmup"](OptimizerSettings(schedule="warmup", warmup_steps=4))
    assert [f(k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_reaches_half_at_midpoint_and_the_floor_at_the_end() -> None:
    opt = OptimizerSettings(schedule="cosine", warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    f = SCHEDULES["cosine"](opt)
    assert f(0) == 0.5 and f(1) == 1.0
    assert f(2) == pytest.approx(1.0)
    assert f(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # = 0.55
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)
