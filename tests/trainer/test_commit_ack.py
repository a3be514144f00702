"""Commit before acknowledge, against a real Buffer: a trainer that crashes after its checkpoint but
before its ack gets the batch again after a restart, and trains it once, not twice."""

from __future__ import annotations

import time

from trainer_helpers import random_rollouts, run_config

from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.trainer import build_backend
from trinity.trainer import checkpoint as ckpt


def test_a_crash_between_checkpoint_and_ack_trains_each_experience_once(buffer_service, tiny_model, tmp_path, unique):
    config = run_config(tiny_model, "grpo", kl_coef=0.0, save_interval=1)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=unique, claim_idle_ms=200))
        buffer.put(unique, random_rollouts(8, seed=3))

        first = build_backend(config, tmp_path / "ckpt")
        batch = buffer.read(unique, "trainer-1", 8)
        metrics = first.train_step(batch.experiences)  # trains and checkpoints (save_interval 1)
        assert metrics["samples"] == 8 and first.step == 1
        del first  # the process dies here: the checkpoint is on disk, the ack never happened
        assert buffer.stream(unique).stats.pending == 8

        restarted = build_backend(config, tmp_path / "ckpt")
        restarted.load_checkpoint(ckpt.resolve(tmp_path / "ckpt"))
        time.sleep(0.3)  # past claim_idle_ms: the dead consumer's entries can be reclaimed
        again = buffer.read(unique, "trainer-2", 8)
        assert again.reclaimed == 8
        assert sorted(e.id for e in again.experiences) == sorted(e.id for e in batch.experiences)
        redelivered = restarted.train_step(again.experiences)
        assert redelivered["skipped"] == 1.0 and redelivered["dropped/duplicate"] == 8.0
        assert restarted.step == 1  # not trained twice
        assert buffer.ack(unique, again.entry_ids) == 8
        stats = buffer.stream(unique).stats
        assert (stats.pending, stats.acked) == (0, 8)


def test_a_crash_before_the_checkpoint_trains_the_batch_again(buffer_service, tiny_model, tmp_path, unique):
    """Without a durable commit the update is lost with the process, so the batch must be trained again."""
    config = run_config(tiny_model, "grpo", kl_coef=0.0)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=unique, claim_idle_ms=200))
        buffer.put(unique, random_rollouts(4, seed=5))
        first = build_backend(config)
        first.train_step(buffer.read(unique, "trainer-1", 4).experiences)
        del first  # dies before any checkpoint and before the ack
        restarted = build_backend(config)
        time.sleep(0.3)
        again = buffer.read(unique, "trainer-2", 4)
        assert len(again) == 4
        assert restarted.train_step(again.experiences)["samples"] == 4.0
