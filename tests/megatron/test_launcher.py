"""Worker processes: registration, clear errors instead of hangs, and a group that stops as a whole."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from megatron_helpers import grpo_config, random_rollouts

from trinity.trainer.backend import BACKENDS
from trinity.trainer.megatron import MegatronBackend, WorkerGroupError
from trinity.v1 import common_pb2


def _backend(model: Path, **trainer: object) -> MegatronBackend:
    return MegatronBackend(grpo_config(model, backend="megatron", **trainer))


def test_the_megatron_backend_is_loaded_from_its_module_by_name() -> None:
    assert BACKENDS.get("megatron").__module__ == "trinity.trainer.megatron.backend"


def test_an_impossible_split_fails_before_any_worker_starts(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible by tensor_parallel_size=4"):
        _backend(tiny_model, tensor_parallel_size=4)


def test_a_failing_step_raises_with_the_worker_traceback_and_stops_the_group(tiny_model: Path) -> None:
    backend = _backend(tiny_model, tensor_parallel_size=2)
    broken = common_pb2.Experience(id="x", kind=common_pb2.EXPERIENCE_KIND_ROLLOUT, prompt_token_ids=[5])
    with pytest.raises(WorkerGroupError, match="neither response_token_ids nor a response text"):
        backend.train_step([broken])
    assert not backend._workers.alive
    with pytest.raises(WorkerGroupError, match="stopped"):
        backend.train_step(random_rollouts(2))


def test_a_killed_worker_is_reported_and_the_others_are_stopped(tiny_model: Path) -> None:
    backend = _backend(tiny_model, pipeline_parallel_size=2, command_timeout_s=60)
    procs = backend._workers._procs
    os.kill(procs[1].pid, signal.SIGKILL)  # type: ignore[arg-type]
    start = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"\('megatron-rank1', -9\)"):
        backend.train_step(random_rollouts(4))
    assert time.monotonic() - start < 30  # detected by liveness polling, not by a collective timeout
    assert not any(p.is_alive() for p in procs)


def test_an_abandoned_weight_stream_does_not_confuse_the_next_command(tiny_model: Path) -> None:
    with _backend(tiny_model, pipeline_parallel_size=2) as backend:
        first_name, _ = next(iter(backend.named_weights()))
        assert first_name == "model.embed_tokens.weight"
        metrics = backend.train_step(random_rollouts(4))
        assert metrics["model_version"] == 1.0 and backend.model_version == 1
        assert len(dict(backend.named_weights())) == 2 + 9 * 2  # embed, norm, 9 per layer (tied head)
