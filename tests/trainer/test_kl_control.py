"""KL done fully: the KL penalty in the reward switched on from the config, and the adaptive controller
updating the coefficient every step (logged, checkpointed, resumed)."""

from __future__ import annotations

from typing import Any

import pytest
from trainer_helpers import random_rollouts, run_config

from trinity.algorithms import masked_mean
from trinity.config import RunConfig
from trinity.trainer import build_backend
from trinity.trainer.batch import collate, to_samples
from trinity.trainer.torch_backend import TorchBackend


def with_algorithm(cfg: RunConfig, **fields: Any) -> RunConfig:
    """`cfg` with algorithm fields set (validated as a config file would be)."""
    data = cfg.model_dump(mode="json")
    data["algorithm"].update(fields)
    return RunConfig.model_validate(data)


def torch_backend(cfg: RunConfig, *args: Any) -> TorchBackend:
    backend = build_backend(cfg, *args)
    assert isinstance(backend, TorchBackend)
    return backend


def test_the_kl_penalty_is_a_config_choice_and_measures_sampler_against_reference(tiny_model):
    base = run_config(tiny_model, "reinforceplusplus", kl_coef=0.0)
    assert "kl_penalty" not in torch_backend(base).train_step(random_rollouts(6, seed=1))

    backend = torch_backend(with_algorithm(base, kl_penalty="k1", kl_penalty_coef=0.5))
    rollouts = random_rollouts(6, seed=1)
    metrics = backend.train_step(rollouts)
    # k1 per token is sampler log-prob minus reference log-prob; the batch KL is the mean of row means.
    rows = [s.chosen for s in to_samples(rollouts, backend.tokenizer)]
    full = collate(rows, backend.pad_id)
    assert full.old_logprobs is not None
    reference = backend.forward_rows(rows, "reference")
    row_kl = masked_mean(full.old_logprobs - reference, full.mask, dim=-1)
    assert metrics["kl_penalty"] == pytest.approx(float(row_kl.mean()), rel=1e-5)
    assert metrics["kl_coef"] == 0.5


def test_adaptive_controller_updates_the_coefficient_each_step(tiny_model):
    cfg = with_algorithm(
        run_config(tiny_model, "grpo", kl_coef=0.01, optimizer={"lr": 1e-3}),
        kl_controller="adaptive", kl_target=1e-6, kl_horizon=10,
    )  # fmt: skip
    backend = torch_backend(cfg)
    coefs, kls = [], []
    for step in range(3):
        metrics = backend.train_step(random_rollouts(6, seed=10 + step))
        coefs.append(metrics["kl_coef"])
        kls.append(metrics["kl"])
    # Step 1: the policy is the reference (KL 0, far below target): the coefficient shrinks by the full
    # 20% clip, scaled by 6 samples over a horizon of 10.
    assert coefs[0] == 0.01
    assert kls[0] < 1e-9
    assert coefs[1] == pytest.approx(0.01 * (1 - 0.2 * 6 / 10))
    # Step 2 trained a moved policy, far above the target: it grows by the full clip.
    assert kls[1] > 1.2e-6
    assert coefs[2] == pytest.approx(coefs[1] * (1 + 0.2 * 6 / 10))


def test_adaptive_coefficient_is_checkpointed_and_resumed(tiny_model, tmp_path):
    cfg = with_algorithm(
        run_config(tiny_model, "reinforceplusplus", kl_coef=0.0, optimizer={"lr": 1e-3}),
        kl_penalty="k3", kl_penalty_coef=0.2, kl_controller="adaptive", kl_target=1e-6, kl_horizon=4,
    )  # fmt: skip
    first = torch_backend(cfg, tmp_path)
    for step in range(2):
        first.train_step(random_rollouts(6, seed=20 + step))
    path = first.save_checkpoint()
    saved = first.kl.value
    assert saved != 0.2  # it moved
    continued = first.train_step(random_rollouts(6, seed=30))

    resumed = torch_backend(cfg, tmp_path)
    assert resumed.kl.value == 0.2
    resumed.load_checkpoint(path)
    assert resumed.kl.value == saved
    again = resumed.train_step(random_rollouts(6, seed=30))
    assert again["kl_coef"] == continued["kl_coef"] == saved
    assert again["kl_penalty"] == pytest.approx(continued["kl_penalty"], rel=1e-5)
    assert resumed.kl.value == pytest.approx(first.kl.value, rel=1e-6)


def test_bad_kl_settings_are_refused_naming_the_field(tiny_model):
    with pytest.raises(ValueError, match=r"algorithm\.kl_controller"):
        build_backend(with_algorithm(run_config(tiny_model, "dapo"), kl_controller="adaptive"))
    with pytest.raises(ValueError, match=r"algorithm\.kl_penalty"):
        build_backend(with_algorithm(run_config(tiny_model, "sft"), kl_penalty="k1", kl_penalty_coef=0.1))
    with pytest.raises(ValueError, match="kl_penalty"):
        with_algorithm(run_config(tiny_model, "grpo"), kl_penalty="k9")
