"""ExplorerRunner in `explore`, `bench` and `serve` modes, against real Buffer and Gateway processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from explorer_helpers import scripted_runner

from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, TaskSetConfig, naming
from trinity.explorer.engines.base import Engine, GenerationRequest, Sample
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.v1 import explorer_pb2


class Borrowed(Engine):
    """The shared session engine, lent to a runner that closes its engine when it finishes."""

    def __init__(self, inner: Engine) -> None:
        super().__init__()
        self.inner = inner

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        return self.inner._generate(prompts, requests)

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner._load_weights(named_tensors)


def test_explore_mode_puts_every_sample_and_completes_leases_with_pass_rates(
    buffer_service: Any, gateway: Any, tiny_model_dir: Path, tokenizer: Any, tmp_path: Path, unique: str
) -> None:
    rows = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in (1, 2)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    taskset = {"path": str(data), "prompt_key": "question", "reward_fn": "accuracy", "epochs": 2}
    config = RunConfig.model_validate(
        {
            "mode": "explore",
            "model": {"path": str(tiny_model_dir)},
            "algorithm": {"repeat_times": 2},
            "buffer": {"batch_size": 2, "total_steps": 1, "taskset": taskset},
        }
    )
    name, stream = naming.taskset(unique, 0, "train"), naming.experience_stream(unique, 0)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_taskset(TaskSetConfig(name=name, **taskset))
        buffer.create_stream(StreamConfig(name=stream))
        engine = ScriptedEngine(tokenizer, lambda prompt: "2" if "1+1" in prompt else "0")  # right on row 0 only
        runner = scripted_runner(config, unique, buffer_service, gateway, engine, "explorer-test")
        runner.start()
        runner.join(timeout=60)
        assert runner.state == "finished" and runner.step == 1
        assert len(buffer.read(stream, "reader", 10).experiences) == 2 * 2
        # The next epoch's tasks carry the pass rates the explorer completed the first epoch with.
        again = buffer.lease_tasks(name, "another-explorer", 2).tasks
        assert {t.index: t.pass_rate for t in again} == {0: 1.0, 1: 0.0}


def test_bench_mode_writes_the_report(
    buffer_service: Any, gateway: Any, tiny_model_dir: Path, tokenizer: Any, tmp_path: Path, unique: str
) -> None:
    rows = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in (1, 2, 3)]
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "reports" / "bench.json"
    config = RunConfig.model_validate(
        {
            "mode": "bench",
            "model": {"path": str(tiny_model_dir)},
            "buffer": {"eval_tasksets": [{"name": "arith", "path": str(data), "prompt_key": "question"}]},
            "explorer": {"workflow": "math", "eval_repeat_times": 2, "bench_output": str(out)},
        }
    )
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_taskset(
            TaskSetConfig(
                name=naming.taskset(unique, 0, "arith"),
                path=str(data),
                prompt_key="question",
                reward_fn="accuracy",
                epochs=1000,
            )
        )
    # Right only on 1+1: accuracy 1/3, pass@1 = pass@2 = 1/3; each reply is one byte-token + the EOS token.
    engine = ScriptedEngine(tokenizer, lambda prompt: "2" if "1+1" in prompt else "0")
    runner = scripted_runner(config, unique, buffer_service, gateway, engine, "explorer-test")
    runner.start()
    runner.join(timeout=60)
    assert runner.state == "finished"
    report = json.loads(out.read_text())
    expected = {"tasks": 3.0, "samples": 6.0, "failed": 0.0, "accuracy": 1 / 3, "mean_reward": 1 / 3}
    assert report["overall"] == pytest.approx({**expected, "pass@1": 1 / 3, "pass@2": 1 / 3, "response_tokens": 2.0})
    assert report["tasksets"]["arith"] == report["overall"]
    assert report["model_path"] == str(tiny_model_dir) and report["model_version"] == 0
    assert runner.finish_message == f"bench report: {out.resolve()}"


def test_serve_mode_records_calls_until_stopped(
    buffer_service: Any, gateway: Any, vllm_engine: Any, tiny_model_dir: Path, unique: str
) -> None:
    config = RunConfig.model_validate(
        {"mode": "serve", "model": {"path": str(tiny_model_dir), "max_response_tokens": 8}}
    )
    stream = naming.experience_stream(unique, 0, "experiences")
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=stream))
        runner = scripted_runner(config, unique, buffer_service, gateway, Borrowed(vllm_engine), "explorer-test")
        runner.start()
        deadline = time.monotonic() + 60
        while not runner.openai_url and runner.state != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.openai_url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=runner.openai_url.removesuffix("v1"), timeout=60) as http:
            chat = {"messages": [{"role": "user", "content": "hi"}]}
            reply = http.post("v1/chat/completions", json=chat, headers={"X-Session-Id": "s"}).json()
            assert reply["usage"]["completion_tokens"] <= 8  # model.max_response_tokens is the default
            assert http.post("feedback", json={"session_id": "s", "reward": 1.0}).json()["accepted"] == 1
        runner.stop(explorer_pb2.STOP_REASON_CANCELLED, "test over")
        runner.join(timeout=30)
        assert runner.state == "finished" and runner.openai_url == "" and runner.step == 1
        (exp,) = buffer.read(stream, "reader", 10).experiences
        assert exp.reward == 1.0 and exp.run_id == unique and exp.episode_id == "s"
