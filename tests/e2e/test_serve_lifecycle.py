"""How `trinity run` ends and what it tells the user: a serve run that serves on after its last step until
SIGTERM, then succeeds with its summary written; a run SIGTERM'd mid-training is cancelled as Ctrl-C cancels it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import tiny_config, write_config
from trinity.runtime.redis_server import free_port
from trinity.sdk import TrinityClient

pytestmark = pytest.mark.system  # each is a whole `trinity run` (a minute or more on 2 cores)

STOP_WITHIN_S = 60.0  # cancel + summary + `LocalStack.down` (30 s grace for the services to drain)


def _start(config: dict[str, Any], tmp: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    path = write_config(tmp / "config.yaml", config)
    out, log = tmp / "out", tmp / "run.log"
    with log.open("w") as sink:
        command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(path), "--output", str(out), "--quiet"]
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
    return proc, out, log


def _wait(condition: Any, proc: subprocess.Popen[str], log: Path, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"trinity run exited ({proc.returncode}) waiting for {what}:\n{log.read_text()}"
        try:
            if condition():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def _terminate(proc: subprocess.Popen[str]) -> float:
    """SIGTERM to `trinity run`; the seconds until it exited."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WITHIN_S * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - started


def _ask(client: Any, session: str, question: str) -> Any:
    messages = [{"role": "user", "content": question}]
    return client.chat.completions.create(
        model="any", messages=messages, max_tokens=4, extra_headers={"X-Session-Id": session}
    )


def test_a_serve_run_serves_on_after_its_last_step_until_sigterm_and_then_succeeds(tiny_model, tmp_path):
    from openai import OpenAI

    port = free_port()
    config = tiny_config(
        tiny_model,
        **{
            "mode": "serve",
            "buffer.total_steps": 1,  # 2 groups x 4 sessions
            "explorer.openai_port": port,
            "explorer.keep_serving_after_last_step": True,
            "explorer.served_model_name": "tiny-policy",
        },
    )
    for key in ("taskset", "eval_tasksets"):
        del config["buffer"][key]
    for key in ("workflow", "eval_interval"):
        del config["explorer"][key]
    proc, out, log = _start(config, tmp_path)
    base = f"http://127.0.0.1:{port}"
    health = lambda: httpx.get(f"{base}/health", timeout=10).json()  # noqa: E731
    try:
        _wait(lambda: health()["status"] == "ok", proc, log, "the endpoint")
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        for group in range(2):
            for k in range(4):
                session = f"s{group}-{k}"
                _ask(client, session, "1+1?")
                body = {"session_id": session, "reward": float(k % 2), "group_id": f"g{group}"}
                assert httpx.post(f"{base}/feedback", json=body, timeout=30).json()["trained"] is True
        _wait(lambda: health()["training"] is False, proc, log, "the last step")
        after = _ask(client, "late", "2+2?")
        late = httpx.post(f"{base}/feedback", json={"session_id": "late", "reward": 1.0}, timeout=30).json()
        _wait(lambda: "serves on, untrained, until the run is stopped" in log.read_text(), proc, log, "the notice")
        seconds = _terminate(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert proc.returncode == 0, output[-5000:]
    assert after.model == "tiny-policy" and late["trained"] is False and late["experiences"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "RUN_STATE_SUCCEEDED" and [row["step"] for row in summary["train"]] == [1.0]
    assert summary["experience_counts"]["stage0"]["acked"] == 8  # the late session was never put
    assert "gateway at 127.0.0.1:" in output and f"OpenAI endpoint at http://127.0.0.1:{port}/v1" in output
    assert "terminated (SIGTERM): cancelling the run" in output
    print(f"SIGTERM to exit: {seconds:.1f}s")
    assert seconds < STOP_WITHIN_S


def test_sigterm_mid_training_cancels_the_run_and_writes_the_summary(tiny_model, tmp_path):
    config = tiny_config(tiny_model, **{"buffer.total_steps": 50, "explorer.eval_interval": 0})
    proc, out, log = _start(config, tmp_path)
    try:
        _wait(lambda: re.search(r"gateway at (\S+) ", log.read_text()), proc, log, "the gateway's address")
        gateway = re.search(r"gateway at (\S+) ", log.read_text()).group(1)  # type: ignore[union-attr]
        with TrinityClient(gateway) as client:
            _wait(lambda: any(r.train_step >= 1 for r in client.list_runs()), proc, log, "a train step")
        seconds = _terminate(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 1 and summary["state"] == "RUN_STATE_CANCELLED", output[-5000:]
    assert "terminated (SIGTERM)" in summary["error"] or "terminated (SIGTERM)" in output
    print(f"SIGTERM to exit: {seconds:.1f}s")
    assert seconds < STOP_WITHIN_S
