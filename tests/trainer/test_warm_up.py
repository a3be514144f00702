"""`TorchBackend.warm_up` (run while the trainer waits for its explorers) changes nothing a step sees: the weights are
bitwise unchanged, the optimizer's state is a fresh one's, and the steps that follow train exactly as without it."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.trainer.trainer_helpers import grpo_parts, random_rollouts, run_config
from trinity.trainer.torch_backend import TorchBackend


def _weights(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in backend.named_weights()}


def _backend(model: Path) -> TorchBackend:
    return TorchBackend(run_config(model, optimizer={"lr": 1e-2, "weight_decay": 0.1}), algorithm=grpo_parts())


def test_a_warmed_backend_trains_bitwise_as_a_cold_one(tiny_model: Path) -> None:
    cold, warm = _backend(tiny_model), _backend(tiny_model)
    before = _weights(warm)
    rng = torch.get_rng_state()
    warm.warm_up()

    after = _weights(warm)
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in warm.policy.parameters())
    states = list(warm.optimizer.state.values())
    assert states and all(not torch.any(v) for state in states for v in state.values() if isinstance(v, torch.Tensor))

    for step in range(2):
        batch = random_rollouts(8, seed=step)
        cold_metrics, warm_metrics = cold.train_step(batch), warm.train_step(batch)
        assert cold_metrics["loss/total"] == warm_metrics["loss/total"]
        assert cold_metrics["grad_norm"] == warm_metrics["grad_norm"] > 0
    cold_weights, warm_weights = _weights(cold), _weights(warm)
    assert all(torch.equal(warm_weights[name], tensor) for name, tensor in cold_weights.items())
    assert any(not torch.equal(warm_weights[name], tensor) for name, tensor in before.items())  # it did train


def test_a_resumed_optimizers_moments_are_left_as_they_are(tiny_model: Path) -> None:
    backend = _backend(tiny_model)
    backend.train_step(random_rollouts(8))
    moments = {id(p): {k: v.clone() for k, v in s.items()} for p, s in backend.optimizer.state.items()}
    weights = _weights(backend)

    backend.warm_up()

    for param, state in backend.optimizer.state.items():
        assert all(torch.equal(value, moments[id(param)][key]) for key, value in state.items())
    assert all(torch.equal(_weights(backend)[name], tensor) for name, tensor in weights.items())
