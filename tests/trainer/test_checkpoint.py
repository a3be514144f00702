"""Checkpoint + resume continues a run exactly: same next-step loss and weights as an uninterrupted run."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from trainer_helpers import random_rollouts, run_config

from trinity.trainer.checkpoint import CheckpointNotWritten
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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A filesystem of 16 MiB of its own (the test fills it to the size it needs)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_checkpoint_that_fills_the_disk_is_refused_clearly_and_the_last_good_one_stays(
    tiny_model: Path, small_disk: Path
) -> None:
    batches = [random_rollouts(4, seed=s) for s in range(4)]  # fresh ids: a repeated batch is a skipped step
    a = _backend(tiny_model, small_disk)
    a.train_step(batches[0])
    a.train_step(batches[1])  # step 2: saved by save_interval, and it fits
    assert (small_disk / "latest").read_text() == "step_2"
    checkpoint_bytes = sum(p.stat().st_size for p in (small_disk / "step_2").rglob("*") if p.is_file())
    disk = os.statvfs(small_disk)
    # Another tenant of the disk leaves room for half a checkpoint.
    (small_disk / "other-tenant").write_bytes(b"x" * (disk.f_bavail * disk.f_frsize - checkpoint_bytes // 2))
    a.train_step(batches[2])
    with pytest.raises(CheckpointNotWritten) as refused:
        a.train_step(batches[3])  # step 4: no room for a second checkpoint
    # Which layer meets the full disk first varies (an OSError, or torch's zip writer), the free space does not.
    message = str(refused.value)
    assert message.startswith(f"checkpoint step_4 was not written to {small_disk}: ")
    assert message.endswith("; the newest complete checkpoint is still step_2")
    free_mib = float(re.search(r"\((\d+\.\d) MiB free there\)", message).group(1))
    assert free_mib * 2**20 < checkpoint_bytes  # less than one checkpoint was left
    # Nothing half-written is left.
    assert sorted(p.name for p in small_disk.iterdir()) == ["latest", "other-tenant", "step_2"]
    b = _backend(tiny_model, small_disk / "resumed-nowhere")
    b.load_checkpoint(small_disk)
    assert b.step == 2
