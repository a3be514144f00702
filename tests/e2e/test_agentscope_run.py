"""AgentScope agents trained end to end, both ways: in process (`explorer.workflow: agentscope`, AgentScope's ReAct
agent against the explorer's engine) and through serve mode (examples/online-agent/agentscope_agent.py, AgentScope's
own `Agent` and `OpenAIChatModel` over HTTP). The tiny model's random weights rarely write a tool call: these prove
the plumbing and the accounting; tests/explorer/test_agentscope.py proves the calls."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.e2e.conftest import tiny_config, write_config
from tests.e2e.test_run import _logs, succeeded_summary
from tests.e2e.test_serve_lifecycle import _wait
from trinity.runtime.redis_server import free_port

pytest.importorskip("agentscope")
pytestmark = pytest.mark.system  # each a whole `trinity run` on vLLM

ONLINE_AGENT = Path(__file__).resolve().parents[2] / "examples" / "online-agent"
# AgentScope's system prompt and tool schema are ~900 byte tokens of the tiny model (one per character).
LIMITS = {"model.max_prompt_tokens": 1536, "model.max_response_tokens": 16}


def test_an_in_process_agentscope_run_on_the_tiny_model_succeeds(long_context_tiny_model, tmp_path):
    config = tiny_config(
        long_context_tiny_model,
        **LIMITS,
        **{
            "buffer.total_steps": 2,
            "buffer.eval_tasksets": [],
            "explorer.workflow": "agentscope",
            "explorer.workflow_options": {"agent": "react", "episode_timeout_s": 120},
            "explorer.eval_interval": 0,
        },
    )
    summary = succeeded_summary(config, tmp_path)
    assert len(summary["train"]) == 2
    counts = summary["experience_counts"]["stage0"]
    # Each episode is at least one model call (one experience); 2 batches of 2 tasks x 4 episodes were trained.
    assert counts["put"] == counts["acked"] >= 2 * 2 * 4
    assert counts["pending"] == counts["dead_letters"] == 0


def _agentscope_agent() -> ModuleType:
    sys.path.insert(0, str(ONLINE_AGENT))  # it imports the plain agent's tasks from its folder
    try:
        spec = importlib.util.spec_from_file_location("agentscope_agent", ONLINE_AGENT / "agentscope_agent.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ONLINE_AGENT))


def test_agentscope_agents_train_through_the_serve_endpoint(long_context_tiny_model, tmp_path):
    agent = _agentscope_agent()
    port = free_port()
    config = tiny_config(
        long_context_tiny_model,
        **LIMITS,
        **{"mode": "serve", "buffer.total_steps": 2, "explorer.openai_port": port},  # a step: 2 groups x 4 sessions
    )
    for key in ("taskset", "eval_tasksets"):
        del config["buffer"][key]
    for key in ("workflow", "eval_interval"):
        del config["explorer"][key]
    path, out, log = write_config(tmp_path / "config.yaml", config), tmp_path / "out", tmp_path / "run.log"
    with log.open("w") as sink:
        command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(path), "--output", str(out), "--quiet"]
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    versions, sessions = [], []
    try:
        _wait(lambda: httpx.get(f"{base}/health", timeout=10).json()["status"] == "ok", proc, log, "the endpoint")
        for round_index in range(2):
            versions.append(httpx.get(f"{base}/health", timeout=10).json()["model_version"])
            results = asyncio.run(
                agent.run_sessions(f"{base}/v1", "", 8, 8, repeats=4, max_tokens=16, seed=round_index)
            )
            sessions += [session_id for _, session_id in results]
            if round_index == 0:
                trained = lambda: httpx.get(f"{base}/health", timeout=10).json()["model_version"] > 0  # noqa: E731
                _wait(trained, proc, log, "version 1")
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:] + _logs(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    assert versions == [0, 1]  # the second round's agents were served the weights the first round trained
    assert len(set(sessions)) == 16
    counts = summary["experience_counts"]["stage0"]
    # Every call of every rewarded session became an experience and was trained: at least one call per session.
    assert counts["put"] == counts["acked"] >= 16
    assert counts["pending"] == counts["dead_letters"] == 0
