"""Checkpoint + resume continues a run exactly: same next-step loss and weights as an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import torch
from trainer_helpers import random_rollouts, run_config

from trinity.trainer.torch_backend import TorchBackend


def _backend(model: Path, ckpt: Path) -> TorchBackend:
    # Mini-batches shuffle with the backend's generator and the cosine schedule moves the lr each update,
    # so an exact match needs the RNG, optimizer and scheduler states all restored.
    config = run_config(
        model,
        "grpo",
        kl_coef=0.05,
        total_steps=10,
        mini_batch_size=4,
        optimizer={"lr": 1e-3, "schedule": "cosine", "warmup_steps": 1},
        save_interval=2,
        micro_batch_tokens=48,
    )
    return TorchBackend(config, ckpt)


def test_resume_gives_the_same_next_step_loss_as_an_uninterrupted_run(tiny_model: Path, tmp_path: Path) -> None:
    batches = [random_rollouts(8, seed=s) for s in range(3)]
    a = _backend(tiny_model, tmp_path / "a")
    a.train_step(batches[0])
    a.train_step(batches[1])  # step 2: saved by save_interval
    expected = a.train_step(batches[2])

    b = _backend(tiny_model, tmp_path / "b")
    b.load_checkpoint(tmp_path / "a")
    assert b.step == 2 and b.model_version == 2
    got = b.train_step(batches[2])

    for key in ("loss/total", "pg_loss", "kl", "grad_norm", "lr"):
        assert got[key] == expected[key], key
    for (name, wa), (_, wb) in zip(a.named_weights(), b.named_weights(), strict=True):
        assert torch.equal(wa, wb), name


def test_resume_remembers_consumed_experience_ids(tiny_model: Path, tmp_path: Path) -> None:
    batch = random_rollouts(4, seed=11)
    a = _backend(tiny_model, tmp_path / "a")
    a.train_step(batch)
    path = a.save_checkpoint()
    assert path.name == "step_1"
    b = _backend(tiny_model, tmp_path / "b")
    b.load_checkpoint(path)
    assert b.train_step(batch)["dropped/duplicate"] == 4
