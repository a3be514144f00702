"""Several train task sets: the explorer leases from their mixture, completes each task at its own set, and its
explore events carry each set's metrics (`reward_mean/<name>`, `pass_rate/<name>`, `tasks/<name>`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from explorer_helpers import scripted_runner

from trinity.clients import BufferClient
from trinity.clients.gateway import RunReporter
from trinity.config import MixtureConfig, MixtureMember, RunConfig, StreamConfig, TaskSetConfig, naming
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.rollout import taskset_metrics
from trinity.explorer.rollout_pool import Rollout
from trinity.v1 import common_pb2, gateway_pb2


def _rollout(taskset: str, *rewards: float, failed: int = 0, dropped: bool = False) -> Rollout:
    experiences = [common_pb2.Experience(reward=r) for r in rewards]
    experiences += [common_pb2.Experience(reward=5.0, failed=True) for _ in range(failed)]
    return Rollout(common_pb2.Task(id=f"{taskset}/0", taskset=taskset), experiences, drop_reason="timeout" * dropped)


def test_each_task_set_gets_its_reward_mean_pass_rate_and_task_count_under_its_config_name():
    rollouts = [_rollout("run.s0.math", 1.0, 0.0), _rollout("run.s0.code", 0.5, failed=1), _rollout("run.s0.math", 1.0)]
    metrics = taskset_metrics(rollouts, {"run.s0.math": "math", "run.s0.code": "code"})
    assert metrics == {
        "reward_mean/code": 0.5,  # failed samples are left out, as in the step's own reward_mean
        "pass_rate/code": 0.0,
        "tasks/code": 1.0,
        "reward_mean/math": pytest.approx(2 / 3),
        "pass_rate/math": pytest.approx(2 / 3),
        "tasks/math": 2.0,
    }


def test_a_task_set_whose_rollouts_were_all_dropped_reports_zeros():
    metrics = taskset_metrics([_rollout("run.s0.math", dropped=True)], {"run.s0.math": "math"})
    assert metrics == {"reward_mean/math": 0.0, "pass_rate/math": 0.0, "tasks/math": 1.0}


@pytest.fixture
def buffer(buffer_service: Any) -> Iterator[BufferClient]:
    with BufferClient(buffer_service.address) as client:
        yield client


def test_a_mixed_run_completes_tasks_at_their_own_set_and_reports_each_sets_metrics(
    buffer, buffer_service, gateway, tiny_model_dir, tokenizer, tmp_path, unique, monkeypatch
):
    sets = {}
    for name, answer in (("sevens", "7"), ("eights", "8")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"question": f"{name} {i}?", "answer": answer}) + "\n" for i in range(4)))
        sets[name] = {"name": name, "path": str(path), "prompt_key": "question", "reward_fn": "accuracy"}
    config = RunConfig.model_validate(
        {
            "mode": "explore",
            "model": {"path": str(tiny_model_dir)},
            "algorithm": {"repeat_times": 2},
            "buffer": {"batch_size": 4, "total_steps": 2, "tasksets": list(sets.values()), "mixing": {"seed": 1}},
        }
    )
    names = {name: naming.taskset(unique, 0, name) for name in sets}
    for name, section in sets.items():
        buffer.create_taskset(TaskSetConfig(**{**section, "name": names[name]}))
    members = tuple(MixtureMember(taskset=names[name]) for name in sets)
    buffer.create_mixture(MixtureConfig(name=naming.mixture(unique, 0), members=members))
    buffer.create_stream(StreamConfig(name=naming.experience_stream(unique, 0)))
    events: list[gateway_pb2.RunEvent] = []
    report = RunReporter.report

    def record(self: RunReporter, kind: gateway_pb2.EventKind, **kw: Any) -> bool:
        events.append(gateway_pb2.RunEvent(kind=kind, metrics=kw.get("metrics") or {}))
        return report(self, kind, **kw)

    monkeypatch.setattr(RunReporter, "report", record)
    runner = scripted_runner(config, unique, buffer_service, gateway, ScriptedEngine(tokenizer, lambda p: "7"), "mix")
    runner.start()
    runner.join(timeout=60)
    assert runner.state == "finished" and runner.step == 2
    explored = [e.metrics for e in events if e.kind == gateway_pb2.EVENT_KIND_EXPLORE]
    assert len(explored) == 2
    for metrics in explored:
        assert metrics.get("tasks/sevens", 0) + metrics.get("tasks/eights", 0) == 4
        if "tasks/sevens" in metrics:
            assert (metrics["reward_mean/sevens"], metrics["pass_rate/sevens"]) == (1.0, 1.0)
        if "tasks/eights" in metrics:
            assert (metrics["reward_mean/eights"], metrics["pass_rate/eights"]) == (0.0, 0.0)
    completed = {name: buffer.taskset(names[name]).completed for name in sets}
    assert sum(completed.values()) == 8
    assert completed == {name: sum(m.get(f"tasks/{name}", 0) for m in explored) for name in sets}
