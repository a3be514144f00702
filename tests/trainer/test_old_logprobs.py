"""Where a train step's old log-probs come from: the sampler's, a recomputation, or (one update) the update's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import random_rollouts, run_config

from trinity.trainer import step, torch_backend
from trinity.trainer.batch import plan_updates
from trinity.trainer.step import first_update_only
from trinity.trainer.torch_backend import TorchBackend


def _backend(model: Path, **trainer: object) -> tuple[TorchBackend, list[str]]:
    """A GRPO backend without a KL term whose `forward_rows` passes are recorded by model name."""
    backend = TorchBackend(run_config(model, kl_coef=0.0, **trainer))
    passes: list[str] = []
    rows_passed: list[int] = []
    backend.rows_passed = rows_passed  # type: ignore[attr-defined]
    run_rows = backend.forward_rows

    def recorded(rows, model):  # type: ignore[no-untyped-def]
        passes.append(model)
        rows_passed.append(len(rows))
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


def _recompute_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's plan hidden from `prepare`: every row's old log-probs come from a pass before the first update."""
    prepare = step.prepare
    for module in (step, torch_backend):  # the step's and `compute_gradients`'
        monkeypatch.setattr(module, "prepare", lambda b, alg, samples, updates: prepare(b, alg, samples, []))


def test_the_free_old_logprobs_give_the_gradient_of_a_recomputation(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exps = random_rollouts(10, seed=4)
    free, free_passes = _backend(tiny_model, recompute_old_logprobs=True)
    free_grads = _grads(free, exps)
    _recompute_every_row(monkeypatch)
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


def test_mini_batches_pass_only_the_rows_after_the_first_update(tiny_model: Path) -> None:
    backend, passes = _backend(tiny_model, recompute_old_logprobs=True, mini_batch_size=3)
    metrics = backend.train_step(random_rollouts(8, seed=8))
    assert metrics["updates"] == 3.0
    assert passes == ["policy"] and backend.rows_passed == [5]  # type: ignore[attr-defined]


def test_mini_batches_with_partly_free_old_logprobs_train_as_a_full_recomputation(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exps = random_rollouts(8, seed=9)
    partly_free, _ = _backend(tiny_model, recompute_old_logprobs=True, mini_batch_size=4)
    partly_free.train_step(exps)
    _recompute_every_row(monkeypatch)
    recomputed, _ = _backend(tiny_model, recompute_old_logprobs=True, mini_batch_size=4)
    recomputed.train_step(exps)
    assert recomputed.rows_passed == [8] and partly_free.rows_passed == [4]  # type: ignore[attr-defined]
    after = dict(recomputed.policy.named_parameters())
    for name, param in partly_free.policy.named_parameters():
        torch.testing.assert_close(param, after[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_update_plan_trains_every_sample_once_per_epoch() -> None:
    g = torch.Generator().manual_seed(0)
    plan = plan_updates(10, 4, 2, g)
    assert [len(u) for u in plan] == [4, 4, 2, 4, 4, 2]
    assert sorted(i for u in plan[:3] for i in u) == list(range(10)) == sorted(i for u in plan[3:] for i in u)
    assert plan_updates(10, None, 2, g) == [list(range(10))] * 2 == plan_updates(10, 16, 2, g)


def test_only_samples_no_later_update_trains_again_are_the_first_updates_own() -> None:
    assert first_update_only([[0, 1], [2, 3]]) == [0, 1]
    assert first_update_only([[0, 1], [1, 2]]) == [0]
    assert first_update_only([[0, 1, 2], [0, 1, 2]]) == []  # two epochs of one mini-batch
    assert first_update_only(()) == []
