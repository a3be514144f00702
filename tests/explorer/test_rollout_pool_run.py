"""Rollout failures in the explore loop, against a real Buffer and Gateway: a broken task is dropped and completed
as failed while the run finishes; a setup that never works fails fast; leases are renewed while rollouts run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from explorer_helpers import make_task, scripted_runner

from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, TaskSetConfig, naming
from trinity.explorer.engines.base import GenerationTimeout
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.leases import LeaseKeeper
from trinity.explorer.rollout import fail_fast, rollout_results
from trinity.explorer.rollout_pool import Rollout
from trinity.explorer.runner import ExplorerRunner
from trinity.v1 import common_pb2

ROWS = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(4)]


@pytest.fixture
def buffer(buffer_service: Any) -> Iterator[BufferClient]:
    with BufferClient(buffer_service.address) as client:
        yield client


def explore(
    buffer: BufferClient,
    buffer_service: Any,
    gateway: Any,
    model: Path,
    tokenizer: Any,
    data: Path,
    run_id: str,
    reply: Any,
) -> ExplorerRunner:
    """Mode explore over `data` (2 tasks a step, 2 samples each) with a scripted engine; returns the ended runner."""
    taskset = {"path": str(data), "prompt_key": "question", "reward_fn": "accuracy"}
    config = RunConfig.model_validate(
        {
            "mode": "explore",
            "model": {"path": str(model)},
            "algorithm": {"repeat_times": 2},
            "buffer": {"batch_size": 2, "total_steps": 2, "taskset": taskset},
            "explorer": {"rollout_retries": 1},
        }
    )
    buffer.create_taskset(TaskSetConfig(name=naming.taskset(run_id, 0, "train"), **taskset))
    buffer.create_stream(StreamConfig(name=naming.experience_stream(run_id, 0)))
    engine = ScriptedEngine(tokenizer, reply)
    runner = scripted_runner(config, run_id, buffer_service, gateway, engine, "explorer-pool-test")
    runner.start()
    runner.join(timeout=60)
    return runner


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_a_broken_task_is_dropped_and_completed_as_failed_while_the_run_finishes(
    buffer, buffer_service, gateway, tiny_model_dir, tokenizer, data, unique
):
    def reply(prompt: str) -> str:
        if "What is 1+1?" in prompt:
            raise ZeroDivisionError("this task breaks the policy")
        return "0"

    runner = explore(buffer, buffer_service, gateway, tiny_model_dir, tokenizer, data, unique, reply)
    assert runner.state == "finished" and runner.step == 2
    stream = naming.experience_stream(unique, 0)
    experiences = buffer.read(stream, "reader", 100).experiences
    assert sorted({e.task_id for e in experiences}) == [f"{naming.taskset(unique, 0, 'train')}/{i}" for i in (0, 2, 3)]
    assert len(experiences) == 3 * 2
    info = buffer.taskset(naming.taskset(unique, 0, "train"))
    assert (info.completed, info.failed, info.exhausted) == (4, 1, True)  # never handed out again


def test_a_setup_whose_rollouts_never_work_fails_fast(
    buffer, buffer_service, gateway, tiny_model_dir, tokenizer, data, unique, capsys
):
    def reply(prompt: str) -> str:
        raise KeyError("the environment cannot read this task shape")

    runner = explore(buffer, buffer_service, gateway, tiny_model_dir, tokenizer, data, unique, reply)
    assert runner.state == "failed" and runner.step == 0
    assert "no rollout has succeeded yet" in capsys.readouterr().out  # the explorer's failure log names why


def _rollout(reason: str = "", error: BaseException | None = None) -> Rollout:
    experiences = [] if reason else [common_pb2.Experience(reward=1.0)]
    return Rollout(make_task(task_id="set/0"), experiences, attempts=3, drop_reason=reason, error=error)


def test_every_rollout_failing_before_any_success_raises_the_error():
    with pytest.raises(RuntimeError, match=r"set/0.*after 3 attempts: ValueError: bad shape"):
        fail_fast([_rollout("error:ValueError", ValueError("bad shape"))], proven=False)


def test_once_a_rollout_has_worked_a_failed_step_only_drops():
    assert fail_fast([_rollout("error:ValueError", ValueError("bad"))], proven=True)
    assert fail_fast([_rollout(), _rollout("error:ValueError", ValueError("bad"))], proven=False)


def test_timeouts_alone_never_fail_the_run():
    assert not fail_fast([_rollout("timeout", GenerationTimeout("slow"))], proven=False)


def test_a_dropped_task_is_completed_as_failed_and_unscored():
    results = rollout_results([_rollout(), _rollout("timeout", GenerationTimeout("slow"))])
    assert [(r.failed, r.pass_rate, r.samples) for r in results] == [(False, 1.0, 1), (True, -1.0, 0)]


def _lease(buffer: BufferClient, data: Path, name: str, lease_seconds: float) -> common_pb2.Task:
    buffer.create_taskset(TaskSetConfig(name=name, path=str(data), prompt_key="question", lease_seconds=lease_seconds))
    return buffer.lease_tasks(name, "explorer-a", 1).tasks[0]


def test_the_keeper_holds_a_lease_past_its_first_deadline(buffer, data, unique):
    task = _lease(buffer, data, unique, lease_seconds=3.0)  # renewed each second: two renewals may run late
    with LeaseKeeper(buffer, unique, "explorer-a", [task], lease_seconds=3.0) as keeper:
        time.sleep(max(0.0, task.lease_deadline_ms / 1000 - time.time()) + 0.3)
        others = buffer.lease_tasks(unique, "explorer-b", 8).tasks
    assert task.lease_id not in [t.lease_id for t in others]
    assert keeper.lost == []


def test_the_keeper_reports_a_lease_lost_to_another_consumer(buffer, data, unique):
    task = _lease(buffer, data, unique, lease_seconds=0.6)
    with LeaseKeeper(buffer, unique, "explorer-a", [task], lease_seconds=0.6) as keeper:
        buffer.release_tasks("explorer-a", unique)  # expired at once ...
        assert buffer.lease_tasks(unique, "explorer-b", 1).tasks[0].lease_id == task.lease_id  # ... and taken
        deadline = time.monotonic() + 30
        while not keeper.lost and time.monotonic() < deadline:
            time.sleep(0.05)
    assert keeper.lost == [task.id]
