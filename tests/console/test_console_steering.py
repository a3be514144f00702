"""Steering a live run through the console: every service a real process (gateway, buffer, explorer, trainer) on
a tiny model. The explorer's pause holds its loop between steps; the trainer's new learning rate shows in the
`lr` metric of its next train events. About 40 s: marked `system`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.conftest import ServiceProcess
from tests.e2e.conftest import tiny_config
from trinity.console.app import create_app
from trinity.console.settings import ConsoleSettings
from trinity.runtime.client import open_channel
from trinity.v1 import common_pb2, explorer_pb2_grpc

pytestmark = pytest.mark.system

LR, STEERED_LR = 1.0e-3, 5.0e-3
WAIT_S = 180.0


@pytest.fixture(scope="module")
def services(redis_server: Any, stack: ServiceProcess) -> Iterator[None]:
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_GATEWAY": stack.address, "OMP_NUM_THREADS": "1"}
    started = [ServiceProcess(name, env=env).start(timeout=120) for name in ("trainer", "explorer")]
    yield
    for service in started:
        service.stop()


@pytest.fixture(scope="module")
def live(services: None, stack: ServiceProcess) -> Iterator[TestClient]:
    with TestClient(create_app(ConsoleSettings(gateway=stack.address))) as client:
        yield client


def _until(what: str, check: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _events(console: TestClient, run_id: str) -> list[dict[str, Any]]:
    text = console.get(f"/api/runs/{run_id}/events").text  # the run is over: the stream ends
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _explorer_holding(address: str) -> bool:
    with open_channel(address) as channel:
        status = explorer_pb2_grpc.ExplorerServiceStub(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    return status.metrics["exploration_paused"] == 1.0


def _steer(console: TestClient, run_id: str, **knobs: Any) -> list[str]:
    reply = console.post(f"/api/runs/{run_id}/steer", json=knobs)
    assert reply.status_code == 200, reply.text
    return list(reply.json()["applied"])


def _between(events: list[dict[str, Any]], first: str, last: str | None) -> list[dict[str, Any]]:
    start = next(i for i, e in enumerate(events) if e["kind"] == "steer" and e["message"] == first)
    end = next((i for i, e in enumerate(events) if e["kind"] == "steer" and e["message"] == last), len(events))
    return events[start + 1 : end]


def test_a_live_run_pauses_resumes_and_takes_a_new_learning_rate(live, tiny_model: Path, unique: str):
    config = tiny_config(
        tiny_model,
        name=unique,
        **{
            "buffer.total_steps": 6,
            "buffer.eval_tasksets": [],
            "explorer.engine": "transformers",
            "trainer.optimizer": {"lr": LR},
        },
    )
    run_id = live.post("/api/runs", json={"yaml": yaml.safe_dump(config)}).json()["run_id"]
    _until("the first explore step", lambda: live.get(f"/api/runs/{run_id}").json()["explore_step"] >= 1)

    assert _steer(live, run_id, pause_exploration=True) == ["pause_exploration"]
    explorer = next(s for s in live.get(f"/api/runs/{run_id}").json()["services"] if s["role"] == "explorer")
    _until("the explorer to hold", lambda: _explorer_holding(explorer["address"]))
    # While it holds, the trainer can train only what was explored: the rest of the run follows the new rate.
    assert _steer(live, run_id, learning_rate=STEERED_LR, temperature=0.5) == ["temperature", "learning_rate"]
    assert _steer(live, run_id, pause_exploration=False) == ["pause_exploration"]
    _until("the run to end", lambda: live.get(f"/api/runs/{run_id}").json()["state"] in ("SUCCEEDED", "FAILED"))

    assert live.get(f"/api/runs/{run_id}").json()["state"] == "SUCCEEDED"
    events = _events(live, run_id)
    steers = [(e["message"], e["metrics"]) for e in events if e["kind"] == "steer"]
    assert steers == [
        ("exploration paused", {"pause_exploration": 1.0}),
        ("learning_rate 0.001 -> 0.005", {"learning_rate": STEERED_LR}),
        ("temperature 1 -> 0.5", {"temperature": 0.5}),
        ("exploration resumed", {"pause_exploration": 0.0}),
    ]
    paused = _between(events, "exploration paused", "exploration resumed")
    assert sum(e["kind"] == "explore" for e in paused) <= 1  # at most the step that was under way
    assert any(e["kind"] == "explore" for e in _between(events, "exploration resumed", None))
    trained_after = [e["metrics"]["lr"] for e in _between(events, "learning_rate 0.001 -> 0.005", None)
                     if e["kind"] == "train"]  # fmt: skip
    # The step under way when the steer came keeps its rate; every later one uses the new one.
    assert len(trained_after) >= 2 and trained_after[1:] == [pytest.approx(STEERED_LR)] * (len(trained_after) - 1)
