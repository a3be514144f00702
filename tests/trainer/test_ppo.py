"""PPO with a critic: the value head learns the returns, and several epochs/mini-batches run per step."""

from __future__ import annotations

from pathlib import Path

from trainer_helpers import random_rollouts, run_config

from trinity.trainer.torch_backend import TorchBackend


def test_ppo_critic_loss_falls_with_epochs_and_mini_batches(tiny_model: Path) -> None:
    config = run_config(tiny_model, "ppo", ppo_epochs=2, mini_batch_size=4, optimizer={"lr": 1e-3, "critic_lr": 1e-2})
    backend = TorchBackend(config)
    assert backend.critic is not None and backend.reference is not None
    first = backend.train_step(random_rollouts(8, seed=0))
    assert first["updates"] == 4.0  # 2 epochs x 2 mini-batches
    losses = [first["vf_loss"]]
    for s in range(1, 5):
        losses.append(backend.train_step(_renamed(random_rollouts(8, seed=0), s))["vf_loss"])
    assert losses[-1] < losses[0]


def _renamed(exps: list, step: int) -> list:
    for e in exps:
        e.id = f"{e.id}-{step}"
    return exps
