"""The trainer's part of a run ends by the typed stop reason: input exhausted drains the stream first."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from trainer_helpers import random_rollouts

from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, naming
from trinity.trainer.runner import TrainerRunner
from trinity.v1 import explorer_pb2

NO_GATEWAY = "127.0.0.1:1"  # reporting never raises, so the runner needs no gateway to train


@pytest.fixture(autouse=True)
def _short_outages(monkeypatch):
    """Clients retry an unreachable service for TRINITY_OUTAGE_SECONDS; here the gateway never comes."""
    monkeypatch.setenv("TRINITY_OUTAGE_SECONDS", "0.5")


def _runner(buffer_address: str, model: Path, tmp_path: Path, run_id: str) -> TrainerRunner:
    config = RunConfig.model_validate(
        {
            "mode": "train",
            "checkpoint_dir": str(tmp_path),
            "model": {"path": str(model)},
            "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.0, "repeat_times": 8},
            "buffer": {"batch_size": 1, "total_steps": 5, "offline_data": {"path": "unused.jsonl"}},
        }
    )
    return TrainerRunner(
        run_id=run_id,
        stage=0,
        config=config,
        instance_id="trainer-1",
        buffer_address=buffer_address,
        gateway_address=NO_GATEWAY,
        advertise_host="127.0.0.1",
    )


def _run_until_stopped(buffer_service, tiny_model, tmp_path, unique, reason) -> TrainerRunner:
    """Half a train batch (4 of 8) in the stream, then a stop with `reason` while the runner waits for more."""
    stream = naming.experience_stream(unique, 0, "experiences")
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=stream))
        buffer.put(stream, random_rollouts(4, seed=1))
        runner = _runner(buffer_service.address, tiny_model, tmp_path, unique)
        runner.start()
        deadline = time.monotonic() + 60
        while buffer.stream(stream).stats.pending < 4:  # read: it waits for the missing half of the batch
            assert time.monotonic() < deadline and runner.state in ("starting", "running")
            time.sleep(0.1)
    runner.stop(reason, "test")
    runner.join(timeout=120)
    return runner


def test_input_exhausted_trains_what_is_left_in_the_stream_then_finishes(
    buffer_service, tiny_model, tmp_path, unique
) -> None:
    runner = _run_until_stopped(buffer_service, tiny_model, tmp_path, unique, explorer_pb2.STOP_REASON_INPUT_EXHAUSTED)
    assert runner.state == "finished" and runner.step == 1
    assert (tmp_path / unique / "stage0" / "final" / "config.json").exists()


def test_any_other_reason_stops_without_training_a_partial_batch(buffer_service, tiny_model, tmp_path, unique) -> None:
    runner = _run_until_stopped(buffer_service, tiny_model, tmp_path, unique, explorer_pb2.STOP_REASON_CANCELLED)
    assert runner.state == "finished" and runner.step == 0
