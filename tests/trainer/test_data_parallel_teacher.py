"""Distillation and the adaptive KL coefficient on two FSDP2 ranks train what one process trains: the
teacher is sharded like the reference, and every rank adapts the coefficient to the same measured KL."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_data_parallel import GRPO, max_difference, train

from trinity.models.tiny import build_tiny_llama


def test_two_ranks_distill_and_adapt_the_kl_coefficient_as_one_process(tiny_model: Path, tmp_path: Path) -> None:
    teacher = build_tiny_llama(tmp_path / "teacher", vocab_size=272, seed=1)
    fields = {
        "teacher_model": str(teacher),
        "kl_penalty": "k3",
        "kl_penalty_coef": 0.1,
        "kl_controller": "adaptive",
        "kl_target": 1e-6,
        "kl_horizon": 16,
    }
    args = {"model": str(tiny_model), "algorithm": "on_policy_distill", "trainer": GRPO, "algorithm_fields": fields}
    one = train(tmp_path, 1, **args, steps=3)
    two = train(tmp_path, 2, **args, steps=3)
    start = load_file(tiny_model / "model.safetensors")
    assert max(float((one["weights"][k] - start[k]).abs().max()) for k in start) > 1e-4  # it trained
    assert max_difference(two["weights"], one["weights"]) < 1e-5
    coefs = [m["kl_coef"] for m in one["metrics"]]
    assert len(set(coefs)) == 3  # it adapted every step
    for m1, m2 in zip(one["metrics"], two["metrics"], strict=True):
        assert m2["teacher_kl"] == pytest.approx(m1["teacher_kl"], abs=1e-5)
        assert m2["kl_coef"] == pytest.approx(m1["kl_coef"], rel=1e-6)
