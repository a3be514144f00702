"""Serve and train in one run: the example agent (examples/online-agent) trains SmolLM2 through the endpoint.

`trinity run` with the example's config (mode `serve`, GRPO) starts the stack; 16 concurrent `openai`
clients play rounds of 64 sessions (8 questions x 8 sessions) and post their rewards. After each round
the test waits for the weights the trainer made from it, while other clients keep streaming replies
without feedback: the weight load lands in the middle of those streams, and they must all complete;
their sessions expire without feedback and must never be trained.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.test_run import _logs
from trinity.runtime.redis_server import free_port

pytestmark = pytest.mark.system

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "online-agent"
ROUNDS = 5  # = the run's total_steps: one train step per round of feedback
SESSIONS_PER_ROUND = 64  # = train_batch_size: 8 groups x 8 sessions, one call each
CONCURRENCY = 16
SESSION_TTL_S = 3.0


def _agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("online_agent", EXAMPLE / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


class Streamers:
    """Clients streaming replies without feedback until stopped; every stream must end with a finish reason."""

    def __init__(self, base_url: str, clients: int) -> None:
        self.base_url = base_url
        self.started = self.completed = 0
        self.errors: list[str] = []
        self.versions: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Streamers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _loop(self) -> None:
        from openai import OpenAI

        client = OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)
        while not self._stop.is_set():
            with self._lock:
                self.started += 1
            try:
                chunks = client.chat.completions.create(
                    model="policy",
                    messages=[{"role": "user", "content": "Count from one to twenty in words."}],
                    max_tokens=16,  # the example's limit fits agent frameworks (64); these streams need no more
                    stream=True,
                    extra_headers={"X-Session-Id": f"stream-{uuid.uuid4().hex}"},
                )
                finish, versions = None, set()
                for chunk in chunks:
                    versions.add(int((chunk.model_extra or {})["model_version"]))
                    for choice in chunk.choices:
                        finish = choice.finish_reason or finish
                if finish is None:
                    raise AssertionError("the stream ended without a finish reason")
                if len(versions) != 1:
                    raise AssertionError(f"one stream reported versions {sorted(versions)}")
                with self._lock:
                    self.completed += 1
                    self.versions |= versions
            except Exception as err:  # noqa: BLE001 - collected and asserted on by the test
                with self._lock:
                    self.errors.append(repr(err))


def _health(base: str) -> dict[str, Any]:
    return httpx.get(f"{base}/health", timeout=10).json()


def _wait(condition: Any, proc: subprocess.Popen[str], what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"trinity run exited ({proc.returncode}) while waiting for {what}")
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def online_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("online-agent")
    port = free_port()
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    config["buffer"]["total_steps"] = ROUNDS
    config["explorer"].update({"openai_port": port, "session_ttl_seconds": SESSION_TTL_S})
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    agent = _agent()
    out, log = tmp / "out", (tmp / "run.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(tmp / "config.yaml"), "--output", str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    rounds: list[dict[str, Any]] = []
    streamers: list[Streamers] = []
    try:
        _wait(lambda: _health(base)["status"] == "ok", proc, "the endpoint")
        for index in range(ROUNDS):
            version = _health(base)["model_version"]
            rewards = agent.run_sessions(
                f"{base}/v1", "", SESSIONS_PER_ROUND, CONCURRENCY, repeats=8, stream=index % 2 == 1, seed=index
            )
            rounds.append({"version": version, "rewards": rewards})
            if index == ROUNDS - 1:
                break  # the trainer's last step ends the run
            with Streamers(f"{base}/v1", clients=4) as streams:  # in flight while the new weights load
                _wait(lambda v=version: _health(base)["model_version"] > v, proc, f"weights after version {version}")
            streamers.append(streams)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp / "run.log").read_text()[-5000:] + _logs(out)
    summary = json.loads((out / "summary.json").read_text())
    return {"summary": summary, "rounds": rounds, "streamers": streamers}


def test_the_run_trains_one_step_per_round_of_feedback_and_succeeds(online_run):
    summary = online_run["summary"]
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    assert [row["step"] for row in summary["train"]] == [float(s) for s in range(1, ROUNDS + 1)]


def test_each_round_is_served_by_the_weights_the_previous_round_trained(online_run):
    assert [r["version"] for r in online_run["rounds"]] == list(range(ROUNDS))


def test_the_agents_reward_rises_over_the_updates(online_run):
    means = [statistics.fmean(r["rewards"]) for r in online_run["rounds"]]
    print("mean reward by round (version 0..):", [round(m, 3) for m in means])
    assert statistics.fmean(means[-2:]) > means[0] + 0.1, means


def test_every_rewarded_session_is_trained_exactly_once_and_no_other(online_run):
    summary = online_run["summary"]
    counts = summary["experience_counts"]["stage0"]
    rewarded = ROUNDS * SESSIONS_PER_ROUND
    assert counts["put"] == counts["acked"] == rewarded  # the streamed sessions without feedback: never put
    assert counts["pending"] == counts["undelivered"] == counts["dead_letters"] == 0
    assert sum(row["experiences"] for row in summary["explore"]) == rewarded


def test_streams_in_flight_across_weight_loads_all_complete(online_run):
    for streams in online_run["streamers"]:
        assert streams.errors == []
        assert streams.completed == streams.started > 0
    versions = set().union(*(s.versions for s in online_run["streamers"]))
    assert len(versions) > 1  # the streams spanned weight updates


def test_sessions_without_feedback_expire_and_are_counted(online_run):
    summary = online_run["summary"]
    expired = max(row.get("expired_sessions_total", 0.0) for row in summary["explore"])
    streamed = sum(s.completed for s in online_run["streamers"])
    assert 0 < expired <= streamed
