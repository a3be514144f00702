"""Serve mode: the OpenAI-compatible endpoint records calls and turns a session's reward into experiences.

Real parts: the shared tiny vLLM engine, a real Buffer service (Redis), FastAPI's TestClient, and
for the HTTP tests uvicorn in a thread reached by httpx / the example agent.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.explorer.explorer_helpers import hf_logprobs
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.explorer.chat_tools import parse_tool_calls, render_chat
from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
from trinity.explorer.sessions import SessionStore
from trinity.models.tiny import CHATML_TEMPLATE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stream(buffer_service: Any, unique: str) -> tuple[BufferClient, str]:
    client = BufferClient(buffer_service.address)
    client.create_stream(StreamConfig(name=unique))
    yield client, unique
    client.close()


@pytest.fixture
def app(vllm_engine: Any, stream: tuple[BufferClient, str]) -> Any:
    buffer, name = stream
    backend = ServeBackend(
        engine=lambda: vllm_engine,
        put=lambda exps: buffer.put(name, exps).accepted,
        model_name="tiny",
        run_id="serve-test",
        max_tokens=16,
    )
    return create_app(backend)


def _chat(client: TestClient, content: str, session: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 12, **extra}
    reply = client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_chat_completion_returns_text_and_usage(app: Any, tokenizer: Any) -> None:
    client = TestClient(app)
    out = _chat(client, "2+3=", "s1")
    prompt = tokenizer.encode("<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    assert isinstance(out["choices"][0]["message"]["content"], str)
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    assert out["usage"]["prompt_tokens"] == len(prompt)
    assert 1 <= out["usage"]["completion_tokens"] <= 12
    assert out["usage"]["total_tokens"] == len(prompt) + out["usage"]["completion_tokens"]
    assert out["session_id"] == "s1"
    assert len(app.state.sessions) == 1


def test_feedback_puts_each_call_with_exact_tokens_logprobs_and_reward(
    app: Any, stream: tuple[BufferClient, str], tokenizer: Any, hf_model: Any
) -> None:
    buffer, name = stream
    client = TestClient(app)
    replies = [_chat(client, "hello", "ep", temperature=1.0), _chat(client, "again", "ep", temperature=1.0)]
    fb = client.post("/feedback", json={"session_id": "ep", "reward": 0.75, "components": {"task": 1.0}})
    assert fb.status_code == 200 and fb.json() == {"session_id": "ep", "experiences": 2, "accepted": 2}
    batch = buffer.read(name, "reader", 10)
    assert len(batch) == 2
    for step, (exp, reply, text) in enumerate(zip(batch.experiences, replies, ("hello", "again"), strict=True)):
        chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        assert list(exp.prompt_token_ids) == tokenizer.encode(chat, add_special_tokens=False)
        assert len(exp.response_token_ids) == reply["usage"]["completion_tokens"]
        # vLLM holds back an incomplete UTF-8 tail that HF decodes as U+FFFD (random byte-level tokens)
        decoded = tokenizer.decode(list(exp.response_token_ids), skip_special_tokens=True)
        assert decoded.rstrip("\ufffd") == reply["choices"][0]["message"]["content"].rstrip("\ufffd")
        expected = hf_logprobs(hf_model, list(exp.prompt_token_ids), list(exp.response_token_ids))
        assert list(exp.logprobs) == pytest.approx(expected, abs=1e-4)
        assert list(exp.action_mask) == [True] * len(exp.response_token_ids)
        assert exp.reward == 0.75 and dict(exp.reward_components) == {"task": 1.0}
        assert exp.group_id == "ep" and exp.episode_id == "ep" and exp.step_index == step
        assert exp.run_id == "serve-test" and exp.info["session_id"] == "ep"
    assert len(app.state.sessions) == 0


def test_feedback_group_id_groups_sessions(app: Any, stream: tuple[BufferClient, str]) -> None:
    buffer, name = stream
    client = TestClient(app)
    for sid in ("a", "b"):
        _chat(client, "q", sid)
        assert (
            client.post("/feedback", json={"session_id": sid, "reward": 1.0, "group_id": "task-7"}).status_code == 200
        )
    exps = buffer.read(name, "reader", 10).experiences
    assert sorted(e.episode_id for e in exps) == ["a", "b"] and {e.group_id for e in exps} == {"task-7"}


def test_feedback_for_unknown_or_closed_session_is_404(app: Any) -> None:
    client = TestClient(app)
    assert client.post("/feedback", json={"session_id": "never", "reward": 1.0}).status_code == 404
    _chat(client, "x", "once")
    assert client.post("/feedback", json={"session_id": "once", "reward": 1.0}).status_code == 200
    second = client.post("/feedback", json={"session_id": "once", "reward": 1.0})
    assert second.status_code == 404 and "session_id" in second.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "tiny"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
    ],
)
def test_malformed_request_is_422_naming_the_field(app: Any, body: dict[str, Any], field: str) -> None:
    reply = TestClient(app).post("/v1/chat/completions", json=body)
    assert reply.status_code == 422
    assert any(field in err["loc"] for err in reply.json()["detail"])


def test_malformed_feedback_is_422_naming_the_field(app: Any) -> None:
    reply = TestClient(app).post("/feedback", json={"session_id": "s"})
    assert reply.status_code == 422 and any("reward" in e["loc"] for e in reply.json()["detail"])


def test_models_and_health(app: Any) -> None:
    client = TestClient(app)
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert client.get("/health").json()["status"] == "ok"


def test_bearer_token_is_required_when_configured(vllm_engine: Any) -> None:
    backend = ServeBackend(engine=lambda: vllm_engine, put=lambda e: len(e), model_name="tiny", api_key="k")
    client = TestClient(create_app(backend))
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
    assert client.get("/health").status_code == 200


def test_failed_put_keeps_the_session_for_a_retry(vllm_engine: Any) -> None:
    stored: list[Any] = []

    def flaky_put(exps: list[Any]) -> int:
        if not stored:
            stored.append(None)
            raise RuntimeError("buffer unavailable")
        return len(exps)

    client = TestClient(create_app(ServeBackend(engine=lambda: vllm_engine, put=flaky_put, model_name="tiny")))
    _chat(client, "x", "s")
    assert client.post("/feedback", json={"session_id": "s", "reward": 1.0}).status_code == 503
    assert client.post("/feedback", json={"session_id": "s", "reward": 1.0}).json()["experiences"] == 1


# ---- tools ----------------------------------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def test_tools_go_into_the_system_prompt_when_the_template_ignores_them(tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "2*3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "6"},
    ]
    text = render_chat(tokenizer, messages, [TOOL])
    assert text.startswith("<|im_start|>system\nFunctions you may call:\n<tools>\n")
    assert json.dumps(TOOL, separators=(",", ":")) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
        in text
    )
    assert text.endswith("<|im_start|>tool\n6<|im_end|>\n<|im_start|>assistant\n")


def test_tools_use_the_template_argument_when_the_template_reads_them(tokenizer: Any) -> None:
    import copy

    tok = copy.copy(tokenizer)
    tok.chat_template = "{% if tools %}TOOLS={{ tools | length }}\n{% endif %}" + CHATML_TEMPLATE
    text = render_chat(tok, [{"role": "user", "content": "hi"}], [TOOL, TOOL])
    assert text == "TOOLS=2\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_parse_tool_calls_splits_content_and_calls() -> None:
    content, calls = parse_tool_calls(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    )
    assert content == "Let me compute."
    assert [c["function"] for c in calls] == [{"name": "calculator", "arguments": '{"expression": "6*7"}'}]
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_session_store_expires_idle_sessions() -> None:
    from trinity.explorer.sessions import RecordedCall

    now = [0.0]
    store = SessionStore(ttl_s=10, clock=lambda: now[0])
    store.record("s", RecordedCall("c", [1], [2], [-0.1], 0))
    now[0] = 11.0
    assert store.close("s") is None and store.expired == 1


# ---- over real HTTP ------------------------------------------------------------------------------------


def test_example_agent_runs_against_a_real_server(app: Any, stream: tuple[BufferClient, str]) -> None:
    spec = importlib.util.spec_from_file_location("calculator_agent", REPO / "examples/agent/calculator_agent.py")
    assert spec is not None and spec.loader is not None
    agent = importlib.util.module_from_spec(spec)
    sys.modules["calculator_agent"] = agent
    spec.loader.exec_module(agent)
    server = OpenAIServer(app)
    url = server.start()
    try:
        with httpx.Client(base_url=url.removesuffix("v1"), timeout=60) as client:
            episode = agent.run_episode(client, 3, 4, max_turns=2, max_tokens=8)
    finally:
        server.stop()
    buffer, name = stream
    exps = buffer.read(name, "reader", 10).experiences
    assert len(exps) == episode.calls >= 1
    assert {e.group_id for e in exps} == {"mul-3-4"} and {e.reward for e in exps} == {episode.reward}
    assert agent.calculate("(3 + 4) * 2") == "14" and agent.reward("Answer: 12", 12) == 1.0


def test_prompt_longer_than_the_context_is_400(app: Any) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 4}
    reply = TestClient(app).post("/v1/chat/completions", json=body)
    assert reply.status_code == 400 and reply.json()["detail"].startswith("messages:")
