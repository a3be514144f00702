"""Serve mode: an OpenAI-compatible HTTP endpoint whose calls become training experiences.

An agent written in any framework points its OpenAI client at `http://host:port/v1`. Each chat call
is sampled by the run's engine and recorded (exact prompt/response token ids and sampling log-probs)
under a session id; the application then posts a reward to `/feedback`, for a whole session or for
one response, and the rewarded calls go to the run's experience stream (`sessions.py`).

Session id of a call: the `X-Session-Id` header, else the body's `session_id`, else `user`, else a
fresh id; it is echoed in the `X-Session-Id` response header and the body's `session_id`. Every
response and every streamed chunk carries the weight version that produced it (`model_version`,
header `X-Model-Version`); the response id is `chatcmpl-<call id>`.

Every error is answered in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so that
OpenAI SDKs show the reason: an invalid body is a 400 whose `param` names the field (FastAPI's 422 is
not what OpenAI clients expect). A streamed request that cannot be served (a prompt the engine
refuses, `max_tokens` over the run's limit) is refused before the stream starts, as the same call
without `stream` is.

Endpoints: `POST /v1/chat/completions`, `POST /feedback` (also `/v1/feedback`), `GET /v1/models`,
`GET /health`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import ssl
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from trinity.explorer.chat_tools import parse_tool_calls, render_chat
from trinity.explorer.engines.base import (
    Engine,
    GenerationRequest,
    GenerationResult,
    GenerationStream,
    Sample,
    SampleDelta,
    SamplingSettings,
)
from trinity.explorer.openai_schema import ChatCompletionRequest, FeedbackRequest
from trinity.explorer.sessions import RecordedCall, SessionStore, feedback_experiences
from trinity.runtime.logging import get_logger
from trinity.runtime.tls import TlsSettings
from trinity.v1 import common_pb2

log = get_logger(__name__)

SESSION_HEADER = "X-Session-Id"
VERSION_HEADER = "X-Model-Version"
# Engine calls block a worker thread for the whole generation (or until the next token of a stream); they get
# a pool of their own so hundreds of agents in flight cannot starve /health and /feedback of the default pool.
ENGINE_THREADS = 256

T = TypeVar("T")


class OpenAIError(Exception):
    """An error the endpoint answers in OpenAI's shape; `param` names the request field at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "none"})


def _field_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as a field path: ("body", "messages", 0, "role") -> "messages[0].role".

    Pydantic names the member of a union that failed (`stop.list[constrained-str]`); those tags are dropped."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
    return path


def _invalid_request(err: RequestValidationError) -> OpenAIError:
    """FastAPI's 422 as OpenAI's 400: every problem in the message, the first one's field as `param`."""
    problems = list(dict.fromkeys((_field_path(tuple(e.get("loc", ()))), str(e.get("msg", ""))) for e in err.errors()))
    message = "; ".join(f"{path}: {msg}" if path else msg for path, msg in problems) or "invalid request body"
    return OpenAIError(400, message, param=(problems[0][0] or None) if problems else None)


def _install_error_handlers(app: FastAPI) -> None:
    async def openai_error(_request: Request, err: Exception) -> Response:
        assert isinstance(err, OpenAIError)
        return err.response()

    async def invalid_request(_request: Request, err: Exception) -> Response:
        assert isinstance(err, RequestValidationError)
        return _invalid_request(err).response()

    async def http_error(_request: Request, err: Exception) -> Response:  # routing: unknown path, wrong method
        assert isinstance(err, StarletteHTTPException)
        return OpenAIError(err.status_code, str(err.detail)).response()

    async def server_error(_request: Request, err: Exception) -> Response:
        log.exception("serve.request_failed", error=str(err))
        return OpenAIError(500, f"internal error: {type(err).__name__}: {err}").response()

    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, server_error)


@dataclass
class ServeBackend:
    """What the endpoint needs from the explorer.

    `engine` returns the engine (None while the model loads); `put` stores rewarded calls'
    experiences and returns how many the Buffer accepted; `max_tokens` is the most tokens one
    response may sample (the run's `model.max_response_tokens`) and the default when a call gives none.
    `training` says whether rewarded calls are still trained on: once it is False (the run's last step
    is trained, `explorer.keep_serving_after_last_step`) calls are answered but not recorded, and
    feedback is answered with no experiences.
    """

    engine: Callable[[], Engine | None]
    put: Callable[[list[common_pb2.Experience]], int]
    model_name: str
    run_id: str = ""
    max_tokens: int = 1024
    api_key: str | None = None
    training: Callable[[], bool] = lambda: True


def create_app(backend: ServeBackend, sessions: SessionStore | None = None) -> FastAPI:
    """The FastAPI app; `app.state.sessions` is the SessionStore it records into.

    `app.state.abandoned` counts requests whose reply was not delivered whole (the client left, or the
    engine failed mid-stream): they are never recorded. Only the event loop's thread touches it.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.engine_threads = anyio.CapacityLimiter(ENGINE_THREADS)  # bound to the server's event loop
        yield

    app = FastAPI(title="Trinity explorer (serve mode)", lifespan=lifespan)
    _install_error_handlers(app)
    store = sessions if sessions is not None else SessionStore()  # an empty store is falsy (__len__)
    app.state.sessions = store
    app.state.abandoned = 0

    def abandon() -> None:
        app.state.abandoned += 1

    def authorize(authorization: str | None = Header(default=None)) -> None:
        expected = f"Bearer {backend.api_key}".encode()
        if backend.api_key and not secrets.compare_digest((authorization or "").encode(), expected):
            raise OpenAIError(401, "missing or wrong bearer token", code="invalid_api_key")

    api = APIRouter(dependencies=[Depends(authorize)])

    @app.get("/health")
    def health() -> dict[str, Any]:
        engine = backend.engine()
        stats = store.stats()
        return {
            "status": "ok" if engine is not None else "loading",
            "training": backend.training(),
            "model_version": engine.model_version if engine is not None else 0,
            "calls_in_flight": engine.calls_in_flight if engine is not None else 0,
            "open_sessions": stats.open_sessions,
            "expired_sessions": stats.expired_sessions,
            "expired_calls": stats.expired_calls,
            "abandoned_requests": app.state.abandoned,
        }

    @api.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": backend.model_name, "object": "model", "owned_by": "trinity"}]}

    # Async: the handler bridges to the engine through worker threads (`engine_threads`), so a stream whose
    # client goes away is cancelled on the event loop and closes its GenerationStream at once (abort), which a
    # sync iterator in Starlette's threadpool would only do when the next token arrived, if ever.
    @api.post("/v1/chat/completions")
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, x_session_id: str | None = Header(default=None)
    ) -> Response:
        engine = backend.engine()
        if engine is None:
            raise OpenAIError(503, "the model is still loading; retry shortly", code="model_loading")
        limiter: anyio.CapacityLimiter = request.app.state.engine_threads
        sampling = _sampling(body, backend.max_tokens)
        generation = await _in_thread(limiter, _generation_request, engine, body, sampling)
        try:
            stream = await _in_thread(limiter, engine.stream, generation)
        except Exception as err:
            _raise_if_refused(err)
            raise
        session_id = x_session_id or body.session_id or body.user or uuid.uuid4().hex
        reply = _Reply(
            call_id=uuid.uuid4().hex,
            session_id=session_id,
            model=backend.model_name,
            model_version=stream.model_version,
            choices=generation.n,
            tools=_tools(body) is not None,
            logprobs=bool(body.logprobs),
            tokenizer=engine.tokenizer,
        )
        headers = {SESSION_HEADER: session_id, VERSION_HEADER: str(stream.model_version)}

        def record(calls: list[RecordedCall]) -> None:
            if backend.training():  # past the run's last step nothing is trained: nothing is kept for feedback
                store.record(session_id, calls)

        if body.stream:
            # The first delta is awaited before the status line: an engine refuses a request (a prompt over its
            # context) when it first reads it, and that must be a 400 like the unstreamed call's, not an event.
            deltas = iter(stream)
            try:
                first = await anyio.to_thread.run_sync(next, deltas, None, limiter=limiter, abandon_on_cancel=True)
            except BaseException as err:
                stream.close()
                if isinstance(err, Exception):
                    _raise_if_refused(err)
                raise
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return _EventStream(reply, stream, deltas, first, limiter, record, include_usage, abandon, headers)
        try:
            result = await _in_thread(limiter, _drain, stream)
        except Exception as err:
            stream.close()
            _raise_if_refused(err)
            raise
        if await request.is_disconnected():  # nobody will see this reply: it must not be trained on
            log.info("serve.client_gone", session_id=session_id, response_id=reply.response_id)
            abandon()
            return Response(status_code=499)
        record(reply.calls(result))
        return JSONResponse(reply.completion(result), headers=headers)

    @api.post("/feedback")
    @api.post("/v1/feedback")  # for clients that only know the /v1 base URL
    def feedback(body: FeedbackRequest) -> dict[str, Any]:
        training = backend.training()
        if body.response_id is not None:
            taken = store.take_response(body.response_id, body.choice_index)
            group = body.group_id or body.response_id
            choice = "" if body.choice_index is None else f" with choice_index {body.choice_index}"
            missing = f"response_id: no unrewarded response {body.response_id!r}{choice} (unknown, expired, rewarded)"
        else:
            assert body.session_id is not None  # the validator asks for exactly one of them
            taken = store.close(body.session_id)
            group = body.group_id or body.session_id
            missing = f"session_id: no open session {body.session_id!r} (never called, expired, or rewarded)"
        if not training:  # the run trains no more: what the session held is dropped, the agent carries on
            session_id = taken.session_id if taken is not None else body.session_id
            return _feedback_reply(session_id, body.response_id, group, experiences=0, accepted=0, trained=False)
        if taken is None:
            raise OpenAIError(404, missing, param="response_id" if body.response_id is not None else "session_id")
        experiences = feedback_experiences(
            taken, run_id=backend.run_id, reward=body.reward, group_id=group, components=body.components
        )
        try:
            accepted = backend.put(experiences)
        except Exception as err:  # noqa: BLE001 - any failure: keep the calls so the feedback can be retried
            store.restore(taken)
            log.warning("serve.put_failed", session_id=taken.session_id, response_id=body.response_id, error=str(err))
            raise OpenAIError(503, f"the buffer did not take the experiences: {err}") from None
        log.info("serve.feedback", session_id=taken.session_id, group_id=group, experiences=len(experiences))
        return _feedback_reply(
            taken.session_id, body.response_id, group, experiences=len(experiences), accepted=accepted, trained=True
        )

    app.include_router(api)
    return app


@contextlib.asynccontextmanager
async def in_process(app: FastAPI) -> AsyncIterator[httpx.ASGITransport]:
    """A transport for `httpx` (and the OpenAI SDK over it) that calls `app` in this event loop, without a socket;
    the app's lifespan runs around it."""
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)


def _feedback_reply(
    session_id: str | None, response_id: str | None, group: str, *, experiences: int, accepted: int, trained: bool
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "response_id": response_id,
        "group_id": group,
        "experiences": experiences,
        "accepted": accepted,
        "trained": trained,
    }


async def _in_thread(limiter: anyio.CapacityLimiter, fn: Callable[..., T], *args: Any) -> T:
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


def _tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    if body.tool_choice == "none" or not body.tools:
        return None
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


def _sampling(body: ChatCompletionRequest, limit: int) -> SamplingSettings:
    name, asked = "max_completion_tokens", body.max_completion_tokens
    if asked is None:
        name, asked = "max_tokens", body.max_tokens
    if asked is not None and asked > limit:
        msg = f"{asked} is more than this run's limit of {limit} tokens per response (model.max_response_tokens)"
        raise RequestValidationError([{"type": "value_error", "loc": ("body", name), "msg": msg, "input": asked}])
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingSettings(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k,
        max_tokens=asked or limit,
        stop=stop,
    )


def _generation_request(engine: Engine, body: ChatCompletionRequest, sampling: SamplingSettings) -> GenerationRequest:
    """The prompt tokens of the chat (tools rendered in) and how to sample it; runs in a worker thread."""
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    tok = engine.tokenizer
    try:
        text = render_chat(tok, messages, _tools(body))
    except Exception as err:  # noqa: BLE001 - a template error is the caller's chat, not a server fault
        raise OpenAIError(400, f"messages: chat template failed: {err}", param="messages") from None
    ids = tok.encode(text, add_special_tokens=False)
    return GenerationRequest(prompt_token_ids=ids, n=body.n or 1, sampling=sampling)


def _drain(stream: GenerationStream) -> GenerationResult:
    for _ in stream:
        pass
    return stream.result()


@dataclass
class _Reply:
    """One chat completion being answered: its ids, and how its parts read in OpenAI's format."""

    call_id: str
    session_id: str
    model: str
    model_version: int
    choices: int
    tools: bool
    logprobs: bool
    tokenizer: Any
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return f"chatcmpl-{self.call_id}"

    def envelope(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "session_id": self.session_id,
            "model_version": self.model_version,
        }

    def message(self, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
        """The assistant message of one sample's text and its OpenAI finish reason."""
        content, tool_calls = parse_tool_calls(text) if self.tools else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
            finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        return message, finish_reason

    def token_logprobs(self, token_ids: list[int], logprobs: list[float]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        tokens = [self.tokenizer.decode([t]) for t in token_ids]
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(tokens, logprobs, strict=True)
            ]
        }

    def completion(self, result: GenerationResult) -> dict[str, Any]:
        choices = []
        for index, sample in enumerate(result.samples):
            message, finish = self.message(sample.text, sample.finish_reason)
            logprobs = self.token_logprobs(sample.token_ids, sample.logprobs)
            choices.append({"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs})
        return {**self.envelope("chat.completion"), "choices": choices, "usage": _usage(result)}

    def chunk(self, index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return _sse({**self.envelope("chat.completion.chunk"), "choices": [choice]})

    def calls(self, result: GenerationResult) -> list[RecordedCall]:
        """Every choice as its own recorded call (`call_id` alone when there is one)."""
        many = len(result.samples) > 1
        return [
            RecordedCall(
                call_id=f"{self.call_id}-{index}" if many else self.call_id,
                prompt_token_ids=result.prompt_token_ids,
                response_token_ids=list(sample.token_ids),
                logprobs=list(sample.logprobs),
                model_version=result.model_version,
                prompt_text=result.prompt_text,
                response_text=sample.text,
                finish_reason=sample.finish_reason,
                tool_calls=len(parse_tool_calls(sample.text)[1]) if self.tools else 0,
                response_id=self.response_id,
                choice_index=index,
            )
            for index, sample in enumerate(result.samples)
        ]


def _usage(result: GenerationResult) -> dict[str, int]:
    prompt = len(result.prompt_token_ids)
    completion = sum(len(s.token_ids) for s in result.samples)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class _EventStream(StreamingResponse):
    """A streamed reply: SSE chunks while the engine samples; recorded only if every choice finished.

    With tools the text is held back: tool calls are parsed from the whole text, so each choice's
    content and `tool_calls` arrive together in its final chunks. However the response ends (done,
    client gone, engine failure), `_end` runs once: a reply that was not recorded is aborted in the
    engine and counted. It is called here, not in the generator's `finally`, because Starlette cancels
    the body on a disconnect without closing it, and a generator that never started has no `finally`.
    """

    def __init__(
        self,
        reply: _Reply,
        stream: GenerationStream,
        deltas: Iterator[SampleDelta],
        first: SampleDelta | None,
        limiter: anyio.CapacityLimiter,
        record: Callable[[list[RecordedCall]], None],
        include_usage: bool,
        abandon: Callable[[], None],
        headers: dict[str, str],
    ) -> None:
        self._reply, self._stream, self._limiter, self._record = reply, stream, limiter, record
        self._deltas, self._first = deltas, first
        self._include_usage, self._abandon = include_usage, abandon
        self._recorded = False
        self._events = self._chunks()
        super().__init__(self._events, media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._recorded:  # before the await: a cancelled task may not get past it
                self._stream.close()
                self._abandon()
            await self._events.aclose()

    async def _chunks(self) -> AsyncGenerator[str, None]:
        """Role deltas, content deltas, each choice's finish chunk, the usage chunk if asked, `[DONE]`."""
        reply = self._reply
        samples: dict[int, Sample] = {}
        try:
            for index in range(reply.choices):
                yield reply.chunk(index, {"role": "assistant", "content": ""})
            delta = self._first
            while delta is not None:
                sample = samples.setdefault(delta.index, Sample([], [], "", ""))
                sample.token_ids += delta.token_ids
                sample.logprobs += delta.logprobs
                sample.text += delta.text
                if not reply.tools and (delta.text or (reply.logprobs and delta.token_ids)):
                    logprobs = reply.token_logprobs(delta.token_ids, delta.logprobs)
                    yield reply.chunk(delta.index, {"content": delta.text}, logprobs=logprobs)
                if delta.finish_reason is not None:
                    for chunk in self._final_chunks(delta.index, sample, delta.finish_reason):
                        yield chunk
                # Abandoned on cancel: the worker may wait for a token that only the abort in `__call__` ends.
                delta = await anyio.to_thread.run_sync(
                    next, self._deltas, None, limiter=self._limiter, abandon_on_cancel=True
                )
            result = self._stream.result()
            self._record(reply.calls(result))
            self._recorded = True
            if self._include_usage:
                yield _sse({**reply.envelope("chat.completion.chunk"), "choices": [], "usage": _usage(result)})
            yield _sse("[DONE]")
        except Exception as err:  # noqa: BLE001 - the status line is sent: the error can only travel as an event
            log.warning("serve.stream_failed", response_id=reply.response_id, error=str(err))
            error = {"message": f"generation failed: {err}", "type": "server_error", "param": None, "code": None}
            yield _sse({"error": error})

    def _final_chunks(self, index: int, sample: Sample, finish_reason: str) -> list[str]:
        reply = self._reply
        message, finish = reply.message(sample.text, finish_reason)
        chunks = []
        if reply.tools:
            held: dict[str, Any] = {"content": message["content"] or None}
            if "tool_calls" in message:
                held["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            chunks.append(reply.chunk(index, held, logprobs=reply.token_logprobs(sample.token_ids, sample.logprobs)))
        chunks.append(reply.chunk(index, {}, finish=finish))
        return chunks


def _raise_if_refused(err: Exception) -> None:
    """A generate failure the request caused becomes the caller's 400; any other goes on (a 500)."""
    if is_request_error(err):
        raise OpenAIError(400, f"messages: {err}", param="messages") from None


def is_request_error(err: Exception) -> bool:
    """A generate failure caused by the request (e.g. a prompt longer than max_model_len).

    vLLM raises `VLLMValidationError`, which is not a ValueError; matched by name so this module
    stays engine-agnostic (no vllm import).
    """
    return isinstance(err, ValueError) or type(err).__name__.endswith("ValidationError")


class OpenAIServer:
    """The app on uvicorn in a background thread; `start` returns the bound URL (port 0 = a free one)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, tls: TlsSettings | None = None) -> None:
        import uvicorn

        self.app = app
        # HTTPS with the explorer's own certificate and client rule (trinity.runtime.tls): the bearer token that
        # guards this endpoint is the services' token, so it travels encrypted wherever the gRPC links do.
        https: dict[str, Any] = {}
        if tls is not None and tls.serves_tls:
            https = {
                "ssl_certfile": str(tls.cert),
                "ssl_keyfile": str(tls.key),
                "ssl_ca_certs": str(tls.ca) if tls.ca else None,
                "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.client_auth == "require" else ssl.CERT_NONE,
            }
        self.scheme = "https" if https else "http"
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))  # bound here so a busy port fails in the caller, with the port named
        self.host, self.port = host, int(self._socket.getsockname()[1])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, **https))
        self._thread = threading.Thread(target=self._serve, name="openai-api", daemon=True)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{self.scheme}://{host}:{self.port}/v1"

    def _serve(self) -> None:
        self._server.run(sockets=[self._socket])

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        log.info("serve.listening", url=self.url)
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()
