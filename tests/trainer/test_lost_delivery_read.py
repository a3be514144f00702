"""A read whose reply never reached the trainer (its connection dropped after the buffer delivered) leaves entries
pending under the trainer's name; the trainer sees more pending than it holds and hands them back, so its next read
gets them at once instead of after `claim_idle_ms` (10 min), while what it holds stays with it."""

from __future__ import annotations

from trainer_helpers import random_rollouts

from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, naming
from trinity.trainer import build_backend
from trinity.trainer.runner import TrainerRunner

NO_GATEWAY = "127.0.0.1:1"  # reporting never raises; this test drives the runner's batch reading only
TRAINER = "trainer-1"


def test_entries_delivered_but_never_received_are_read_again(buffer_service, tiny_model, tmp_path, unique, monkeypatch):
    monkeypatch.setenv("TRINITY_OUTAGE_SECONDS", "0.5")
    config = RunConfig.model_validate(
        {
            "mode": "both",
            "model": {"path": str(tiny_model)},
            "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
            "buffer": {"batch_size": 3, "taskset": {"path": "unused.jsonl"}},
        }
    )  # a train batch: 3 tasks x 2 = 6 experiences
    runner = TrainerRunner(
        run_id=unique, stage=0, config=config, instance_id=TRAINER, buffer_address=buffer_service.address,
        gateway_address=NO_GATEWAY, advertise_host="127.0.0.1",
    )  # fmt: skip
    stream = naming.experience_stream(unique, 0, "experiences")
    backend = build_backend(config)
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
