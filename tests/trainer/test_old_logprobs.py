"""Where a train step's old log-probs come from: the sampler's, a recomputation, or (one update) the update's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import random_rollouts, run_config

from trinity.config import TorchTrainerConfig
from trinity.trainer.torch_backend import TorchBackend


def _backend(model: Path, **trainer: object) -> tuple[TorchBackend, list[str]]:
    """A GRPO backend without a KL term whose `forward_rows` passes are recorded by model name."""
    backend = TorchBackend(run_config(model, kl_coef=0.0, **trainer))
    passes: list[str] = []
    run_rows = backend.forward_rows

    def recorded(rows, model):  # type: ignore[no-untyped-def]
        passes.append(model)
        return run_rows(rows, model)

    backend.forward_rows = recorded  # type: ignore[method-assign]
    return backend, passes


def _grads(backend: TorchBackend, exps: list) -> dict[str, torch.Tensor]:
    backend.compute_gradients(exps)
    return {n: p.grad.clone() for n, p in backend.policy.named_parameters() if p.grad is not None}


def test_one_update_recomputes_old_logprobs_without_an_extra_pass(tiny_model: Path) -> None:
    backend, passes = _backend(tiny_model, recompute_old_logprobs=True)
    metrics = backend.train_step(random_rollouts(8, seed=3))
    assert passes == []
    assert metrics["pg_clipfrac"] == 0.0 and metrics["ppo_kl"] == 0.0  # the ratio is exactly 1


def test_the_free_old_logprobs_give_the_gradient_of_a_recomputation(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exps = random_rollouts(10, seed=4)
    free, free_passes = _backend(tiny_model, recompute_old_logprobs=True)
    free_grads = _grads(free, exps)
    monkeypatch.setattr(TorchTrainerConfig, "single_update", lambda self, samples: False)
    recomputed, passes = _backend(tiny_model, recompute_old_logprobs=True)
    recomputed_grads = _grads(recomputed, exps)
    assert free_passes == [] and passes == ["policy"]
    assert free_grads.keys() == recomputed_grads.keys() and free_grads
    for name, grad in free_grads.items():
        torch.testing.assert_close(grad, recomputed_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_sampler_logprobs_are_ignored_once_recomputed(tiny_model: Path) -> None:
    exps = random_rollouts(6, seed=5)
    shifted = [type(e)() for e in exps]
    for a, b in zip(exps, shifted, strict=True):
        b.CopyFrom(a)
        b.logprobs[:] = [x - 1.0 for x in a.logprobs]
    first, _ = _backend(tiny_model, recompute_old_logprobs=True)
    second, _ = _backend(tiny_model, recompute_old_logprobs=True)
    for name, grad in _grads(first, exps).items():
        torch.testing.assert_close(grad, _grads(second, shifted)[name], msg=name)


def test_several_updates_per_step_recompute_before_the_first(tiny_model: Path) -> None:
    backend, passes = _backend(tiny_model, recompute_old_logprobs=True, ppo_epochs=2)
    backend.train_step(random_rollouts(8, seed=6))
    assert passes == ["policy"]


def test_the_sampler_logprobs_are_the_default(tiny_model: Path) -> None:
    backend, passes = _backend(tiny_model)
    metrics = backend.train_step(random_rollouts(8, seed=7))
    assert passes == [] and metrics["ppo_kl"] != 0.0  # the random sampler log-probs are far from the policy's
