"""Serve mode: the OpenAI-compatible endpoint, driven by the real `openai` client over a real uvicorn.

Engines: the scripted engine (real tokenizer, replies from a function), a scripted engine that streams
one token at a time when the test says so (`SteppedEngine`: disconnects, weight loads mid-stream,
concurrency), and the tiny Hugging Face model where log-probs must be real. Feedback goes to a real
Buffer service. One `slow` test runs the same path on vLLM.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.explorer.explorer_helpers import hf_logprobs
from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig
from trinity.config.modes import RunMode
from trinity.explorer.chat_tools import parse_tool_calls, render_chat
from trinity.explorer.engines.base import Engine, GenerationRequest, SampleDelta
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
from trinity.explorer.sessions import SessionStore
from trinity.models.tiny import CHATML_TEMPLATE

REPO = Path(__file__).resolve().parents[2]
REPLY = "The answer is 7."
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
TOOL_REPLY = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n</tool_call>'


class SteppedEngine(ScriptedEngine):
    """Streams its scripted replies one token per `release()`; `close()` of a stream is recorded as an abort.

    It runs streams concurrently (no serial lock), as a continuous-batching engine does.
    """

    def __init__(self, tokenizer: Any, reply_fn: Callable[[str], str] = lambda _: REPLY) -> None:
        super().__init__(tokenizer, reply_fn)
        self._tokens = threading.Semaphore(0)
        self.aborted = threading.Event()
        self.streams_done = 0

    def release(self, tokens: int = 10_000) -> None:
        for _ in range(tokens):
            self._tokens.release()

    def _stream(
        self, prompt: list[int], request: GenerationRequest, finished: Callable[[], None]
    ) -> tuple[Iterator[SampleDelta], Callable[[], None]]:
        (samples,) = self._generate([prompt], [request])
        decode = self.tokenizer.decode

        def deltas() -> Iterator[SampleDelta]:
            try:
                for index, sample in enumerate(samples):
                    sent = ""
                    for k, token in enumerate(sample.token_ids):
                        self._tokens.acquire()
                        if self.aborted.is_set():
                            return
                        last = k == len(sample.token_ids) - 1
                        upto = sample.text if last else decode(sample.token_ids[: k + 1], skip_special_tokens=True)
                        piece, sent = upto[len(sent) :], upto
                        finish = sample.finish_reason if last else None
                        yield SampleDelta(index, [token], [sample.logprobs[k]], piece, finish)
                self.streams_done += 1
            finally:
                finished()

        def abort() -> None:
            self.aborted.set()
            self._tokens.release()
            finished()

        return deltas(), abort


@pytest.fixture
def stream(buffer_service: Any, unique: str) -> Iterator[tuple[BufferClient, str]]:
    client = BufferClient(buffer_service.address)
    client.create_stream(StreamConfig(name=unique))
    yield client, unique
    client.close()


@contextlib.contextmanager
def serving(
    engine: Engine,
    put: Callable[[list[Any]], int] = len,
    sessions: SessionStore | None = None,
    **backend: Any,
) -> Iterator[tuple[openai.OpenAI, Any]]:
    """The endpoint on a real uvicorn; yields an `openai` client pointed at it and the app."""
    app = create_app(ServeBackend(engine=lambda: engine, put=put, model_name="tiny", **backend), sessions)
    server = OpenAIServer(app)
    url = server.start()
    client = openai.OpenAI(base_url=url, api_key=backend.get("api_key") or "unused", max_retries=0, timeout=60)
    try:
        yield client, app
    finally:
        client.close()
        server.stop()


def root(client: openai.OpenAI) -> str:
    return str(client.base_url).rstrip("/").removesuffix("/v1")


def buffered(stream: tuple[BufferClient, str]) -> Callable[[list[Any]], int]:
    buffer, name = stream
    return lambda exps: buffer.put(name, exps).accepted


def ask(client: openai.OpenAI, session: str = "s", **extra: Any) -> Any:
    messages = extra.pop("messages", [{"role": "user", "content": "3+4?"}])
    headers = {"X-Session-Id": session}
    return client.chat.completions.create(model="tiny", messages=messages, extra_headers=headers, **extra)


def post_feedback(client: openai.OpenAI, **body: Any) -> httpx.Response:
    return httpx.post(f"{root(client)}/feedback", json=body, timeout=30)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def scripted(tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, lambda _: REPLY)


# ---- chat completions ------------------------------------------------------------------------------------


def test_completion_carries_text_usage_session_version_and_its_id(scripted: ScriptedEngine, tokenizer: Any) -> None:
    with serving(scripted) as (client, app):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "3+4?"}], extra_headers={"X-Session-Id": "s1"}
        )
        reply = raw.parse()
        (call,) = app.state.sessions.close("s1").calls
    prompt = tokenizer.encode("<|im_start|>user\n3+4?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert reply.object == "chat.completion" and reply.id == f"chatcmpl-{call.call_id}"
    assert reply.choices[0].message.content == REPLY and reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == len(prompt) == len(call.prompt_token_ids)
    assert reply.usage.completion_tokens == len(call.response_token_ids)
    assert reply.model_extra["session_id"] == "s1" and raw.headers["X-Session-Id"] == "s1"
    assert reply.model_extra["model_version"] == 0 and raw.headers["X-Model-Version"] == "0"


def test_streaming_reassembles_to_the_same_text_and_tokens_as_non_streaming(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer)
    engine.release()
    with serving(engine) as (client, app):
        whole = ask(client, "plain")
        chunks = list(ask(client, "streamed", stream=True))
        plain, streamed = app.state.sessions.close("plain").calls, app.state.sessions.close("streamed").calls
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == REPLY
    assert streamed[0].response_token_ids == plain[0].response_token_ids
    assert streamed[0].prompt_token_ids == plain[0].prompt_token_ids
    assert len({c.id for c in chunks}) == 1 and chunks[0].id == f"chatcmpl-{streamed[0].call_id}"


def test_stream_is_role_then_content_then_finish_then_done_each_chunk_with_its_version(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer)
    engine.release()
    with serving(engine) as (client, _):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        reply = httpx.post(f"{root(client)}/v1/chat/completions", json=body, timeout=30)
    assert reply.headers["content-type"].startswith("text/event-stream") and reply.headers["X-Model-Version"] == "0"
    events = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[-1] == {}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert "".join(d.get("content", "") for d in deltas) == REPLY and len(deltas) > 3  # one per token
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model_version"] for c in chunks} == {0}


def test_include_usage_adds_a_usage_chunk_before_done(scripted: ScriptedEngine) -> None:
    with serving(scripted) as (client, _):
        chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
        whole = ask(client)
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_tool_calls_arrive_with_the_held_back_content_in_the_final_chunks(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer, lambda _: TOOL_REPLY)
    engine.release()
    with serving(engine) as (client, _):
        chunks = list(ask(client, stream=True, tools=[TOOL]))
        whole = ask(client, tools=[TOOL])
    choices = [c.choices[0] for c in chunks]
    assert [c.delta.content for c in choices[:1]] == [""] and choices[-1].finish_reason == "tool_calls"
    (held,) = [c.delta for c in choices if c.delta.tool_calls]
    assert held.content == whole.choices[0].message.content == "Let me compute."
    assert [(t.index, t.function.name, t.function.arguments) for t in held.tool_calls] == [
        (0, "calculator", '{"expression": "3+4"}')
    ]
    assert whole.choices[0].message.tool_calls[0].function.arguments == '{"expression": "3+4"}'
    assert sum(bool(c.delta.content) for c in choices) == 1  # nothing before the whole text was parsed


def test_n_choices_are_n_calls_of_one_response(scripted: ScriptedEngine) -> None:
    with serving(scripted) as (client, app):
        reply = ask(client, "multi", n=3)
        streamed = list(ask(client, "multi", n=2, stream=True))
        calls = app.state.sessions.close("multi").calls
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [(c.response_id, c.choice_index, c.step_index) for c in calls] == [
        (reply.id, 0, 0),
        (reply.id, 1, 0),
        (reply.id, 2, 0),
        (streamed[0].id, 0, 1),
        (streamed[0].id, 1, 1),
    ]
    assert len({c.call_id for c in calls}) == 5
    assert sorted(c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason) == [
        "stop",
        "stop",
    ]


def test_logprobs_are_the_sampled_tokens_log_probs_and_what_is_trained_on(
    hf_engine: Any, hf_model: Any, stream: tuple[BufferClient, str]
) -> None:
    with serving(hf_engine, put=buffered(stream), max_tokens=8) as (client, _):
        reply = ask(client, "lp", logprobs=True, max_tokens=8, temperature=1.0)
        assert post_feedback(client, response_id=reply.id, reward=1.0).status_code == 200
    buffer, name = stream
    (exp,) = buffer.read(name, "reader", 10).experiences
    returned = [t.logprob for t in reply.choices[0].logprobs.content]
    assert list(exp.logprobs) == pytest.approx(returned, abs=1e-6)
    assert len(returned) == reply.usage.completion_tokens == len(exp.response_token_ids)
    expected = hf_logprobs(hf_model, list(exp.prompt_token_ids), list(exp.response_token_ids))
    assert list(exp.logprobs) == pytest.approx(expected, abs=1e-4)


# ---- validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"messages": []}, "messages"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": 1e-7}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"extra_body": {"top_k": 0}}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 65}, "max_tokens"),
        ({"max_completion_tokens": 65}, "max_completion_tokens"),
        ({"n": 17}, "n"),
        ({"stop": ["x"] * 65}, "stop"),
        ({"seed": 1}, "seed"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"5": 3.0}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [TOOL], "tool_choice": "required"}, "tool_choice"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content",
        ),
    ],
)
def test_invalid_request_is_400_in_openai_shape_naming_the_field(
    scripted: ScriptedEngine, extra: dict[str, Any], field: str
) -> None:
    with serving(scripted, max_tokens=64) as (client, app), pytest.raises(openai.BadRequestError) as err:
        ask(client, **extra)
    assert err.value.param == field or str(err.value.param).startswith(f"{field}."), err.value.body
    assert err.value.type == "invalid_request_error" and f"{field}:" in err.value.message
    assert app.state.sessions.stats().recorded_calls == 0


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_tokens": 65}, "max_tokens"),
        ({"seed": 1}, "seed"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ],
)
def test_a_stream_that_cannot_be_served_is_refused_before_it_starts_as_the_plain_call_is(
    scripted: ScriptedEngine, extra: dict[str, Any], field: str
) -> None:
    with serving(scripted, max_tokens=64) as (client, _):
        with pytest.raises(openai.BadRequestError) as plain:
            ask(client, **extra)
        with pytest.raises(openai.BadRequestError) as streamed:
            ask(client, stream=True, **extra)
    assert streamed.value.body == plain.value.body and plain.value.param == field


def test_a_prompt_the_engine_refuses_is_a_400_before_the_stream_starts(tokenizer: Any) -> None:
    class ShortContextEngine(ScriptedEngine):
        """Refuses long prompts when their stream is first read, as vLLM's engine loop does."""

        def _stream(self, prompt: list[int], request: GenerationRequest, finished: Callable[[], None]) -> Any:
            deltas, abort = super()._stream(prompt, request, finished)
            if len(prompt) <= 32:
                return deltas, abort

            def refused() -> Iterator[SampleDelta]:
                finished()
                raise ValueError(f"the prompt ({len(prompt)} tokens) is longer than the maximum model length of 32")
                yield

            return refused(), abort

    engine = ShortContextEngine(tokenizer, lambda _: REPLY)
    long_chat = [{"role": "user", "content": "word " * 64}]
    with serving(engine) as (client, app):
        with pytest.raises(openai.BadRequestError) as plain:
            ask(client, messages=long_chat)
        with pytest.raises(openai.BadRequestError) as streamed:
            ask(client, messages=long_chat, stream=True)
        short = "".join(c.choices[0].delta.content or "" for c in ask(client, stream=True) if c.choices)
        recorded = app.state.sessions.stats().recorded_calls
    assert streamed.value.body == plain.value.body and plain.value.param == "messages"
    assert "maximum model length of 32" in streamed.value.message
    assert short == REPLY and recorded == 1  # the short prompt's call alone


def test_unknown_paths_and_failures_answer_in_openai_error_shape(scripted: ScriptedEngine) -> None:
    def failing_put(_: list[Any]) -> int:
        raise RuntimeError("buffer down")

    with serving(scripted, put=failing_put) as (client, _):
        missing = httpx.get(f"{root(client)}/v1/embeddings")
        bad_json = httpx.post(f"{root(client)}/v1/chat/completions", content=b"{", timeout=30)
        reply = ask(client)
        unavailable = post_feedback(client, response_id=reply.id, reward=1.0)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    assert bad_json.status_code == 400 and set(bad_json.json()["error"]) == {"message", "type", "param", "code"}
    assert unavailable.status_code == 503 and unavailable.json()["error"]["type"] == "server_error"
    assert "buffer down" in unavailable.json()["error"]["message"]


def test_neutral_values_of_refused_fields_are_accepted(scripted: ScriptedEngine) -> None:
    with serving(scripted) as (client, _):
        reply = ask(client, presence_penalty=0, frequency_penalty=0.0, top_logprobs=0, response_format={"type": "text"})
    assert reply.choices[0].message.content == REPLY


def test_feedback_needs_exactly_one_of_session_id_and_response_id(scripted: ScriptedEngine) -> None:
    with serving(scripted) as (client, _):
        both = post_feedback(client, session_id="s", response_id="chatcmpl-x", reward=1.0)
        neither = post_feedback(client, reward=1.0)
        stray_choice = post_feedback(client, session_id="s", choice_index=0, reward=1.0)
        no_reward = post_feedback(client, session_id="s")
    for reply in (both, neither):
        assert reply.status_code == 400 and "session_id" in reply.text and "response_id" in reply.text
    assert stray_choice.status_code == 400 and "choice_index" in stray_choice.text
    assert no_reward.status_code == 400 and no_reward.json()["error"]["param"] == "reward"


# ---- feedback -> experiences ------------------------------------------------------------------------------


def test_response_feedback_trains_its_choices_as_one_group_and_leaves_the_rest(
    scripted: ScriptedEngine, stream: tuple[BufferClient, str]
) -> None:
    with serving(scripted, put=buffered(stream)) as (client, app):
        first = ask(client, "ep")
        multi = ask(client, "ep", n=3)
        fb = post_feedback(client, response_id=multi.id, reward=0.5)
        left = app.state.sessions.close("ep").calls
    assert fb.status_code == 200 and fb.json()["experiences"] == 3 and fb.json()["group_id"] == multi.id
    buffer, name = stream
    exps = buffer.read(name, "reader", 10).experiences
    assert {e.group_id for e in exps} == {multi.id} and {e.reward for e in exps} == {0.5}
    assert sorted(e.info["choice_index"] for e in exps) == ["0", "1", "2"]
    assert {(e.info["session_id"], e.info["response_id"], e.episode_id, e.step_index) for e in exps} == {
        ("ep", multi.id, "ep", 1)
    }
    assert [c.response_id for c in left] == [first.id]


def test_choice_feedback_trains_only_that_choice(scripted: ScriptedEngine, stream: tuple[BufferClient, str]) -> None:
    with serving(scripted, put=buffered(stream)) as (client, _):
        multi = ask(client, "ep", n=2)
        one = post_feedback(client, response_id=multi.id, choice_index=1, reward=1.0)
        again = post_feedback(client, response_id=multi.id, choice_index=1, reward=1.0)
        other = post_feedback(client, response_id=multi.id, choice_index=0, reward=0.0)
    assert one.json()["experiences"] == 1 and again.status_code == 404 and other.json()["experiences"] == 1
    buffer, name = stream
    exps = buffer.read(name, "reader", 10).experiences
    assert sorted((e.info["choice_index"], e.reward, e.group_id) for e in exps) == [
        ("0", 0.0, multi.id),
        ("1", 1.0, multi.id),
    ]


def test_session_feedback_trains_every_call_with_the_session_as_group(
    scripted: ScriptedEngine, stream: tuple[BufferClient, str], tokenizer: Any
) -> None:
    with serving(scripted, put=buffered(stream)) as (client, app):
        replies = [ask(client, "ep", messages=[{"role": "user", "content": q}]) for q in ("hello", "again")]
        fb = post_feedback(client, session_id="ep", reward=0.75, components={"task": 1.0})
        assert len(app.state.sessions) == 0
    assert fb.json() == {
        "session_id": "ep",
        "response_id": None,
        "group_id": "ep",
        "experiences": 2,
        "accepted": 2,
        "trained": True,
    }
    buffer, name = stream
    exps = buffer.read(name, "reader", 10).experiences
    for step, (exp, reply, text) in enumerate(zip(exps, replies, ("hello", "again"), strict=True)):
        chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        assert list(exp.prompt_token_ids) == tokenizer.encode(chat, add_special_tokens=False)
        assert tokenizer.decode(list(exp.response_token_ids), skip_special_tokens=True) == REPLY
        assert exp.reward == 0.75 and dict(exp.reward_components) == {"task": 1.0}
        assert exp.group_id == "ep" and exp.episode_id == "ep" and exp.step_index == step
        assert exp.info["response_id"] == reply.id and exp.id == reply.id.removeprefix("chatcmpl-")


def test_session_feedback_group_id_groups_sessions(scripted: ScriptedEngine, stream: tuple[BufferClient, str]) -> None:
    with serving(scripted, put=buffered(stream)) as (client, _):
        for sid in ("a", "b"):
            ask(client, sid)
            assert post_feedback(client, session_id=sid, reward=1.0, group_id="task-7").status_code == 200
    buffer, name = stream
    exps = buffer.read(name, "reader", 10).experiences
    assert sorted(e.episode_id for e in exps) == ["a", "b"] and {e.group_id for e in exps} == {"task-7"}


def test_feedback_for_unknown_or_rewarded_ids_is_404_naming_the_id(scripted: ScriptedEngine) -> None:
    with serving(scripted) as (client, _):
        reply = ask(client, "once")
        unknown = [post_feedback(client, session_id="never", reward=1.0)]
        unknown.append(post_feedback(client, response_id="chatcmpl-never", reward=1.0))
        assert post_feedback(client, response_id=reply.id, reward=1.0).status_code == 200
        rewarded = [post_feedback(client, response_id=reply.id, reward=1.0)]
        rewarded.append(post_feedback(client, session_id="once", reward=1.0))  # its only call was rewarded
    for fb, field in zip(unknown + rewarded, ["session_id", "response_id", "response_id", "session_id"], strict=True):
        error = fb.json()["error"]
        assert fb.status_code == 404 and error["message"].startswith(f"{field}:") and error["param"] == field


def test_failed_put_keeps_the_calls_for_a_retry(scripted: ScriptedEngine) -> None:
    failures = [RuntimeError("buffer unavailable")] * 2

    def flaky_put(exps: list[Any]) -> int:
        if failures:
            raise failures.pop()
        return len(exps)

    with serving(scripted, put=flaky_put) as (client, _):
        reply = ask(client, "s")
        ask(client, "s")
        assert post_feedback(client, response_id=reply.id, reward=1.0).status_code == 503
        assert post_feedback(client, session_id="s", reward=1.0).status_code == 503
        retried = post_feedback(client, session_id="s", reward=1.0)
    assert retried.status_code == 200 and retried.json()["experiences"] == 2


# ---- sessions expire -------------------------------------------------------------------------------------


def test_sessions_without_feedback_expire_counted_and_untrained(scripted: ScriptedEngine) -> None:
    now = [0.0]
    store = SessionStore(ttl_s=10, clock=lambda: now[0])
    with serving(scripted, sessions=store) as (client, _):
        ask(client, "idle", n=2)
        ask(client, "idle")
        ask(client, "busy")
        now[0] = 8.0
        reply = ask(client, "busy")
        now[0] = 12.0
        swept = store.expire()
        health = httpx.get(f"{root(client)}/health").json()
        late = post_feedback(client, session_id="idle", reward=1.0)
        kept = post_feedback(client, response_id=reply.id, reward=1.0)
    assert (swept.sessions, swept.calls) == (1, 3)
    assert health["expired_sessions"] == 1 and health["expired_calls"] == 3 and health["open_sessions"] == 1
    assert late.status_code == 404 and kept.status_code == 200


# ---- concurrency and weight loads ------------------------------------------------------------------------


def test_sixteen_streams_are_in_flight_at_once_and_each_is_recorded_once(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer)
    results: dict[int, str] = {}

    def agent(i: int, client: openai.OpenAI) -> None:
        if i % 2:
            results[i] = "".join(c.choices[0].delta.content or "" for c in ask(client, f"s{i}", stream=True))
        else:
            results[i] = ask(client, f"s{i}").choices[0].message.content

    with serving(engine) as (client, app):
        threads = [threading.Thread(target=agent, args=(i, client)) for i in range(16)]
        for t in threads:
            t.start()
        wait_for(lambda: engine.calls_in_flight == 16, "16 calls in the engine at once")
        health = httpx.get(f"{root(client)}/health").json()
        engine.release()
        for t in threads:
            t.join(60)
        stats = app.state.sessions.stats()
        per_session = [len(app.state.sessions.close(f"s{i}").calls) for i in range(16)]
    assert health["calls_in_flight"] == 16
    assert results == dict.fromkeys(range(16), REPLY)
    assert stats.recorded_calls == 16 and per_session == [1] * 16


def test_a_weight_load_waits_for_the_stream_in_flight_and_the_next_call_has_the_new_version(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer)
    seen_by_load: list[tuple[int, int]] = []

    def weights() -> Iterator[Any]:  # consumed by the load, under the gate
        seen_by_load.append((engine.calls_in_flight, engine.streams_done))
        yield from ()

    with serving(engine) as (client, _):
        engine.release(1)  # the reply starts with the first token
        chunks = ask(client, stream=True)
        first = next(chunks)  # the role chunk: the request is in the engine
        loader = threading.Thread(target=lambda: engine.load_weights(1, weights()))
        loader.start()
        wait_for(lambda: engine._gate._loads_waiting == 1, "the load to wait at the gate")
        engine.release()
        rest = list(chunks)
        loader.join(30)
        after = ask(client)
    assert seen_by_load == [(0, 1)]  # it ran only after the stream's last token
    assert {c.model_extra["model_version"] for c in [first, *rest]} == {0} and rest[-1].choices[0].finish_reason
    assert after.model_extra["model_version"] == 1 and engine.model_version == 1


def test_a_client_that_leaves_mid_stream_aborts_it_and_nothing_is_recorded(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer)
    with serving(engine) as (client, app):
        engine.release(2)
        chunks = ask(client, "gone", stream=True)
        next(chunks)  # the role chunk
        assert [next(chunks).choices[0].delta.content for _ in range(2)] == ["T", "h"]
        chunks.close()
        wait_for(engine.aborted.is_set, "the engine request to be aborted")
        wait_for(lambda: engine.calls_in_flight == 0, "the aborted call to leave the engine")
        wait_for(lambda: app.state.abandoned == 1, "the request to be counted as abandoned")
        stats = app.state.sessions.stats()
    assert stats.recorded_calls == 0 and stats.open_sessions == 0


def test_a_reply_whose_client_gave_up_waiting_is_not_recorded(tokenizer: Any) -> None:
    engine = SteppedEngine(tokenizer)
    with serving(engine) as (client, app):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(httpx.ReadTimeout):  # the engine produces nothing until the client has gone
            httpx.post(f"{root(client)}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
        engine.release()
        wait_for(lambda: httpx.get(f"{root(client)}/health").json()["abandoned_requests"] == 1, "the reply")
        stats = app.state.sessions.stats()
        assert ask(client, "next").choices[0].message.content == REPLY  # the endpoint serves on
    assert stats.recorded_calls == 0 and stats.open_sessions == 0


# ---- auth, models, health ----------------------------------------------------------------------------------


def test_bearer_token_is_required_when_configured(scripted: ScriptedEngine) -> None:
    with serving(scripted, api_key="k") as (client, _):
        base = root(client)
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.post(f"{base}/feedback", json={"session_id": "s", "reward": 1}).status_code == 401
        assert httpx.get(f"{base}/health").status_code == 200
        assert ask(client).choices[0].message.content == REPLY  # the client's api_key is the token
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0).models.list()


def test_models_and_health(scripted: ScriptedEngine) -> None:
    with serving(scripted) as (client, _):
        assert [m.id for m in client.models.list()] == ["tiny"]
        health = httpx.get(f"{root(client)}/health").json()
    assert health == {
        "status": "ok",
        "training": True,
        "model_version": 0,
        "calls_in_flight": 0,
        "open_sessions": 0,
        "expired_sessions": 0,
        "expired_calls": 0,
        "abandoned_requests": 0,
    }


def test_after_the_last_step_calls_are_answered_untrained_and_health_says_so(scripted: ScriptedEngine) -> None:
    training = threading.Event()
    training.set()
    put: list[Any] = []
    with serving(scripted, put=lambda exps: put.append(exps) or len(exps), training=training.is_set) as (client, app):
        ask(client, "before")
        training.clear()  # the trainer's last step is done; the endpoint serves on
        after = [ask(client, "after").choices[0].message.content]
        after.append("".join(c.choices[0].delta.content or "" for c in ask(client, "after", stream=True) if c.choices))
        held = post_feedback(client, session_id="before", reward=1.0)
        unrecorded = post_feedback(client, session_id="after", reward=1.0)
        health = httpx.get(f"{root(client)}/health").json()
        stats = app.state.sessions.stats()
    assert after == [REPLY, REPLY] and health["status"] == "ok" and health["training"] is False
    for reply in (held, unrecorded):
        assert reply.status_code == 200 and reply.json()["trained"] is False and reply.json()["experiences"] == 0
    assert put == [] and stats.recorded_calls == 1 and stats.open_sessions == 0  # the call before: dropped


# ---- tools -----------------------------------------------------------------------------------------------


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


# An agent framework's second call (AgentScope's ReAct agent sends this shape): its system prompt, the question,
# the model's earlier tool call, the tool's result, the tools again, and parameters of its own.
TOOL_ROUND = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": [{"type": "text", "text": "What is 3+4?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"a": 3, "b": 4}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "7"},
]


@pytest.mark.parametrize("streamed", [False, True])
def test_an_agent_frameworks_tool_round_is_served_with_its_own_parameters(tokenizer: Any, streamed: bool) -> None:
    engine = SteppedEngine(tokenizer, lambda _: TOOL_REPLY)
    engine.release()
    extra = {"tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": True, "messages": TOOL_ROUND}
    with serving(engine) as (client, app):
        if streamed:
            chunks = list(ask(client, "agent", stream=True, stream_options={"include_usage": True}, **extra))
            calls = [t.function.name for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        else:
            calls = [t.function.name for t in ask(client, "agent", **extra).choices[0].message.tool_calls]
        (call,) = app.state.sessions.close("agent").calls
    assert calls == ["calculator"]
    assert '{"a": 3, "b": 4}' in call.prompt_text and "<|im_start|>tool\n7<|im_end|>" in call.prompt_text


@pytest.mark.parametrize(
    ("messages", "tools", "field"),
    [
        ([*TOOL_ROUND[:2], {"role": "assistant", "tool_calls": [{"id": "c"}]}], [TOOL], "messages[2].tool_calls[0]"),
        (TOOL_ROUND[:2], [{"type": "function", "function": {"parameters": {}}}], "tools[0].function.name"),
        (TOOL_ROUND[:2], [{"type": "retrieval"}], "tools[0].type"),
    ],
)
def test_a_malformed_tool_call_or_tool_is_a_400_naming_it(
    scripted: ScriptedEngine, messages: list[dict[str, Any]], tools: list[dict[str, Any]], field: str
) -> None:
    with serving(scripted) as (client, _), pytest.raises(openai.BadRequestError) as err:
        ask(client, messages=messages, tools=tools)
    assert str(err.value.param).startswith(field), err.value.body


def test_parse_tool_calls_splits_content_and_calls() -> None:
    content, calls = parse_tool_calls(TOOL_REPLY)
    assert content == "Let me compute."
    assert [c["function"] for c in calls] == [{"name": "calculator", "arguments": '{"expression": "3+4"}'}]
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


# ---- the example agents --------------------------------------------------------------------------------------


def load_example(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_calculator_agent_episode_becomes_experiences(tokenizer: Any, stream: tuple[BufferClient, str]) -> None:
    agent = load_example("examples/agent/calculator_agent.py")
    replies = iter(['<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>', "Answer: 12"])
    engine = ScriptedEngine(tokenizer, lambda _: next(replies))
    with serving(engine, put=buffered(stream)) as (client, _), httpx.Client(base_url=root(client), timeout=60) as http:
        episode = agent.run_episode(http, 3, 4, max_turns=2, max_tokens=128)
    buffer, name = stream
    exps = buffer.read(name, "reader", 10).experiences
    assert episode.calls == len(exps) == 2 and episode.reward == 1.0
    assert {e.group_id for e in exps} == {"mul-3-4"} and {e.reward for e in exps} == {1.0}
    assert agent.calculate("(3 + 4) * 2") == "14"


# ---- vLLM ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vllm_streams_what_it_records_and_refuses_an_overlong_prompt(
    vllm_engine: Any, hf_model: Any, stream: tuple[BufferClient, str]
) -> None:
    with serving(vllm_engine, put=buffered(stream), max_tokens=12) as (client, _):
        chunks = list(ask(client, "v", stream=True, max_tokens=12, n=2))
        assert post_feedback(client, session_id="v", reward=1.0).json()["experiences"] == 2
        overlong = [{"role": "user", "content": "x" * 2000}]
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, messages=overlong, max_tokens=4)
        with pytest.raises(openai.BadRequestError) as streamed:  # refused before the stream starts, as vLLM reads it
            ask(client, messages=overlong, max_tokens=4, stream=True)
    assert err.value.param == "messages" and err.value.body["message"].startswith("messages:")
    assert streamed.value.body == err.value.body
    buffer, name = stream
    exps = sorted(buffer.read(name, "reader", 10).experiences, key=lambda e: e.info["choice_index"])
    for index, exp in enumerate(exps):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == index)
        assert text == exp.response_text
        expected = hf_logprobs(hf_model, list(exp.prompt_token_ids), list(exp.response_token_ids))
        assert list(exp.logprobs) == pytest.approx(expected, abs=1e-4)


def adds_right_when_a_is_even(prompt: str) -> str:
    *_, (a, b) = re.findall(r"What is (\d)\+(\d)\?", prompt)  # the last question of the chat
    return str(int(a) + int(b) + int(a) % 2)


@pytest.mark.parametrize("stream_replies", [False, True])
def test_online_agent_sessions_become_one_group_per_question(
    tokenizer: Any, stream: tuple[BufferClient, str], stream_replies: bool
) -> None:
    agent = load_example("examples/online-agent/agent.py")
    engine = SteppedEngine(tokenizer, adds_right_when_a_is_even)
    engine.release()
    with serving(engine, put=buffered(stream), api_key="k") as (client, app):
        rewards = agent.run_sessions(str(client.base_url), "k", 8, 4, repeats=4, turns=2, stream=stream_replies)
        stats = app.state.sessions.stats()
    questions = agent.questions(8, 4, random.Random(0))
    assert rewards == [1.0 if q.a % 2 == 0 else 0.0 for q in questions]
    buffer, name = stream
    exps = buffer.read(name, "reader", 100).experiences
    calls = [1 if q.a % 2 == 0 else 2 for q in questions]
    assert len(exps) == sum(calls) == stats.recorded_calls == stats.rewarded_calls
    per_group = collections.Counter(e.group_id.rsplit("-", 1)[0] for e in exps)
    assert per_group == {f"add-{q.a}-{q.b}": 4 * calls[i] for i, q in enumerate(questions) if i % 4 == 0}


def test_online_agent_config_is_a_serve_run_whose_limits_fit_an_agentscope_agent() -> None:
    config = RunConfig.model_validate(yaml.safe_load((REPO / "examples/online-agent/config.yaml").read_text()))
    assert config.mode == RunMode.SERVE and config.algorithm.algorithm_type == "grpo"
    assert config.train_batch_size == config.buffer.batch_size * config.algorithm.group_size
    # AgentScope's ReAct agent with one tool prompts with 236 SmolLM2 tokens, 281 after a tool round (its call: 32).
    assert config.model.path == "smollm2" and config.model.max_prompt_tokens >= 512
    assert config.model.max_response_tokens >= 64
