"""What the trainer holds in the stream between reads. A read whose reply never reached the trainer (its connection
dropped after the buffer delivered) leaves entries pending under the trainer's name; the trainer sees more pending
than it holds and hands them back, so its next read gets them at once instead of after `claim_idle_ms` (10 min),
while what it holds stays with it. What it trained and acknowledges only at its next checkpoint it renews after each
step, so that slow steps do not let a read reclaim (and train again) entries already trained."""

from __future__ import annotations

import pytest
import redis
from trainer_helpers import random_rollouts

from trinity.buffer.keys import StreamKeys
from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, naming
from trinity.trainer import build_backend
from trinity.trainer.runner import TrainerRunner

NO_GATEWAY = "127.0.0.1:1"  # reporting never raises; this test drives the runner's batch reading only
TRAINER = "trainer-1"


@pytest.fixture
def runner(buffer_service, tiny_model, unique, monkeypatch) -> TrainerRunner:
    monkeypatch.setenv("TRINITY_OUTAGE_SECONDS", "0.5")
    config = RunConfig.model_validate(
        {
            "mode": "both",
            "model": {"path": str(tiny_model)},
            "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
            "buffer": {"batch_size": 3, "taskset": {"path": "unused.jsonl"}},
        }
    )  # a train batch: 3 tasks x 2 = 6 experiences
    return TrainerRunner(
        run_id=unique, stage=0, config=config, instance_id=TRAINER, buffer_address=buffer_service.address,
        gateway_address=NO_GATEWAY, advertise_host="127.0.0.1",
    )  # fmt: skip


def test_entries_delivered_but_never_received_are_read_again(runner, buffer_service, unique):
    stream = naming.experience_stream(unique, 0, "experiences")
    backend = build_backend(runner.config)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=stream))
        buffer.put(stream, random_rollouts(12, seed=5))
        lost = buffer.read(stream, TRAINER, 6).entry_ids  # delivered to the trainer; the reply never arrived

        first = runner._read_batch(backend)
        assert first is not None
        runner._unacked = {stream: first[0][stream]}  # trained; acknowledged with the next checkpoint
        runner._drain.set()  # from here an empty read ends the batch instead of waiting for more
        second = runner._read_batch(backend)
        assert second is not None, "the lost entries were not read again"
        # Nothing the trainer holds was handed back: another reader finds nothing to reclaim.
        assert len(buffer.read(stream, "another", 12)) == 0

    first_ids, second_ids = first[0][stream], second[0][stream]
    assert set(second_ids) == set(lost) and not set(first_ids) & set(lost)
    assert len(set(first_ids) | set(second_ids)) == 12


def test_trained_entries_held_for_the_checkpoint_are_renewed_after_each_step(
    runner, buffer_service, redis_server, unique
):
    idle_ms = 60_000
    stream = naming.experience_stream(unique, 0, "experiences")
    backend = build_backend(runner.config)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=stream, claim_idle_ms=idle_ms))
        buffer.put(stream, random_rollouts(6, seed=6))
        batch = runner._read_batch(backend)
        assert batch is not None
        # The step took longer than claim_idle_ms: the entries look idle past it (XCLAIM's IDLE, no waiting).
        redis.Redis.from_url(redis_server.url).xclaim(
            StreamKeys(stream).stream, "trainer", TRAINER, 0, batch[0][stream], idle=idle_ms + 1, justid=True
        )
        runner.backend, backend.state.step = backend, 1  # step 1 of save_interval 10: acked at step 10
        runner._commit(backend, batch[0])
        assert runner._unacked == batch[0]
        assert len(buffer.read(stream, "another", 6)) == 0, "a read reclaimed entries the trainer holds"
