"""mix_chord in mode `both`: the run's offline data are demonstrations mixed into every RL batch at
`algorithm.expert_data_ratio`, through a real buffer (Redis streams, consumer group)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_helpers import random_rollouts

from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, naming
from trinity.trainer import build_backend
from trinity.trainer.expert_data import ExpertStream, expert_count, uses_expert_data
from trinity.trainer.runner import TrainerRunner
from trinity.v1 import common_pb2

NO_GATEWAY = "127.0.0.1:1"  # reporting never raises; these tests drive the runner's batch reading only


@pytest.fixture(autouse=True)
def _short_outages(monkeypatch):
    monkeypatch.setenv("TRINITY_OUTAGE_SECONDS", "0.5")


def demonstrations(path: Path, n: int) -> Path:
    rows = [{"prompt": f"What is {i}+1?", "response": str(i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mixed_config(model: Path, data: Path, ratio: float, algorithm: str = "mix_chord") -> RunConfig:
    return RunConfig.model_validate(
        {
            "mode": "both",
            "model": {"path": str(model)},
            "algorithm": {"algorithm_type": algorithm, "repeat_times": 2, "expert_data_ratio": ratio},
            "buffer": {
                "batch_size": 3,
                "taskset": {"path": "unused.jsonl"},
                "offline_data": {"path": str(data)},
            },
        }
    )


def test_the_ratio_is_the_demonstrations_share_of_the_batch():
    assert expert_count(6, 0.25) == 2  # 2 of 8
    assert expert_count(6, 0.5) == 6
    assert expert_count(6, 0.0) == 0


def test_only_an_exploring_run_of_an_expert_preset_with_offline_data_mixes(tiny_model, tmp_path):
    data = demonstrations(tmp_path / "demos.jsonl", 2)
    assert uses_expert_data(mixed_config(tiny_model, data, 0.25))
    assert uses_expert_data(mixed_config(tiny_model, data, 0.25, "mix"))
    assert not uses_expert_data(mixed_config(tiny_model, data, 0.25, "grpo"))


def test_each_batch_mixes_demonstrations_at_the_ratio_and_trains_them_as_expert_rows(
    buffer_service, tiny_model, tmp_path, unique
):
    config = mixed_config(tiny_model, demonstrations(tmp_path / "demos.jsonl", 3), 0.25)
    runner = TrainerRunner(
        run_id=unique, stage=0, config=config, instance_id="trainer-1", buffer_address=buffer_service.address,
        gateway_address=NO_GATEWAY, advertise_host="127.0.0.1",
    )  # fmt: skip
    stream = naming.experience_stream(unique, 0, "experiences")
    backend = build_backend(config)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=stream))
        buffer.put(stream, random_rollouts(12, seed=4))
        runner.expert = ExpertStream(runner.buffer, config, unique, 0, "trainer-1")
        assert runner.expert.open() == 3
        batch = runner._read_batch(backend)
        assert batch is not None
        entries, experiences, _ = batch
        kinds = [e.kind for e in experiences]
        assert kinds.count(common_pb2.EXPERIENCE_KIND_ROLLOUT) == 6  # train_batch_size = 3 tasks x 2
        assert kinds.count(common_pb2.EXPERIENCE_KIND_SFT) == 2  # a quarter of 8
        assert len(entries[runner.expert.name]) == 2
        metrics = backend.train_step(experiences)
        assert any(k.startswith("expert/") for k in metrics) and any(k.startswith("usual/") for k in metrics)
        runner._commit(backend, entries)
        assert buffer.stream(runner.expert.name).stats.acked == 2

        # A replacement finds the demonstrations loaded: it loads none and reads the one left.
        again = ExpertStream(runner.buffer, config, unique, 0, "trainer-2")
        assert again.open() == 0
        _, rest = again.read()
        assert len(rest) == 1 and rest[0].kind == common_pb2.EXPERIENCE_KIND_SFT
        assert again.read() == ([], [])  # run out: later batches are rollouts only
    runner.buffer.close()
