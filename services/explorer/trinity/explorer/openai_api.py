"""Serve mode: an OpenAI-compatible HTTP endpoint whose calls become training experiences.

An agent written in any framework points its OpenAI client at `http://host:port/v1`. Each chat call
is sampled by the run's engine and recorded (exact prompt/response token ids and sampling
log-probs) under a session id; the application then posts the session's reward to `/feedback`, and
the recorded calls go to the run's experience stream (`sessions.session_experiences`).

Session id of a call: the `X-Session-Id` header, else the body's `session_id`, else `user`, else a
fresh id; it is echoed in the `X-Session-Id` response header and the body's `session_id`.

Endpoints: `POST /v1/chat/completions`, `POST /feedback`, `GET /v1/models`, `GET /health`.
"""

from __future__ import annotations

import secrets
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trinity.explorer.chat_tools import parse_tool_calls, render_chat
from trinity.explorer.engines.base import Engine, GenerationRequest, SamplingSettings
from trinity.explorer.sessions import RecordedCall, SessionStore, session_experiences
from trinity.runtime.limits import MAX_ITEMS, MAX_NAME_CHARS, MAX_PROMPT_CHARS, MAX_STOP_STRINGS
from trinity.runtime.logging import get_logger
from trinity.runtime.tls import TlsSettings
from trinity.v1 import common_pb2

log = get_logger(__name__)

SESSION_HEADER = "X-Session-Id"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    content: str | list[dict[str, Any]] | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


StopText = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


class ChatCompletionRequest(BaseModel):
    """The OpenAI fields serve mode honours; other fields OpenAI clients send are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_ITEMS)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_ITEMS)
    tool_choice: str | dict[str, Any] | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    n: int = Field(default=1, ge=1, le=1, description="one sample per call: each call is one recorded step")
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    session_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("streaming is not supported in serve mode; send stream=false")
        return value


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    reward: float
    components: dict[str, float] = Field(default_factory=dict, max_length=MAX_ITEMS)
    group_id: str = Field(
        default="", max_length=MAX_NAME_CHARS, description="sessions that attempt the same task share it (GRPO groups)"
    )


@dataclass
class ServeBackend:
    """What the endpoint needs from the explorer.

    `engine` returns the engine (None while the model loads); `put` stores a closed session's
    experiences and returns how many the Buffer accepted.
    """

    engine: Callable[[], Engine | None]
    put: Callable[[list[common_pb2.Experience]], int]
    model_name: str
    run_id: str = ""
    max_tokens: int = 128
    api_key: str | None = None


def create_app(backend: ServeBackend, sessions: SessionStore | None = None) -> FastAPI:
    """The FastAPI app; `app.state.sessions` is the SessionStore it records into."""
    app = FastAPI(title="Trinity explorer (serve mode)")
    store = sessions or SessionStore()
    app.state.sessions = store
    app.state.calls = 0

    @app.middleware("http")
    async def _auth(request: Request, call_next: Callable[[Request], Any]) -> Any:
        if backend.api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given, f"Bearer {backend.api_key}"):
                return JSONResponse(status_code=401, content={"detail": "missing or wrong bearer token"})
        return await call_next(request)

    @app.get("/health")
    def health() -> dict[str, Any]:
        engine = backend.engine()
        return {
            "status": "ok" if engine is not None else "loading",
            "model_version": engine.model_version if engine is not None else 0,
            "open_sessions": len(store),
        }

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": backend.model_name, "object": "model", "owned_by": "trinity"}]}

    @app.post("/v1/chat/completions")
    def chat_completions(body: ChatCompletionRequest, x_session_id: str | None = Header(default=None)) -> JSONResponse:
        engine = backend.engine()
        if engine is None:
            raise HTTPException(status_code=503, detail="the model is still loading; retry shortly")
        session_id = x_session_id or body.session_id or body.user or uuid.uuid4().hex
        tools = None if body.tool_choice == "none" else body.tools
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        tok = engine.tokenizer
        try:
            text = render_chat(tok, messages, tools)
        except Exception as err:  # noqa: BLE001 - a template error is the caller's chat, not a server fault
            raise HTTPException(status_code=400, detail=f"messages: chat template failed: {err}") from None
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        sampling = SamplingSettings(
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=body.max_completion_tokens or body.max_tokens or backend.max_tokens,
            stop=stop,
        )
        request = GenerationRequest(prompt_token_ids=tok.encode(text, add_special_tokens=False), sampling=sampling)
        try:
            (result,) = engine.generate([request])
        except Exception as err:
            if not is_request_error(err):
                raise
            raise HTTPException(status_code=400, detail=f"messages: {err}") from None
        sample = result.samples[0]
        content, tool_calls = parse_tool_calls(sample.text) if tools else (sample.text, [])
        call_id = uuid.uuid4().hex
        store.record(
            session_id,
            RecordedCall(
                call_id=call_id,
                prompt_token_ids=result.prompt_token_ids,
                response_token_ids=list(sample.token_ids),
                logprobs=list(sample.logprobs),
                model_version=result.model_version,
                prompt_text=result.prompt_text,
                response_text=sample.text,
                finish_reason=sample.finish_reason,
                tool_calls=len(tool_calls),
            ),
        )
        app.state.calls += 1
        message: dict[str, Any] = {"role": "assistant", "content": content}
        finish = sample.finish_reason
        if tool_calls:
            message["tool_calls"] = tool_calls
            finish = "tool_calls" if finish == "stop" else finish
        prompt_tokens, completion_tokens = len(result.prompt_token_ids), len(sample.token_ids)
        payload = {
            "id": f"chatcmpl-{call_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": backend.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "session_id": session_id,
            "model_version": result.model_version,
        }
        return JSONResponse(payload, headers={SESSION_HEADER: session_id})

    @app.post("/feedback")
    @app.post("/v1/feedback")  # for clients that only know the /v1 base URL
    def feedback(body: FeedbackRequest) -> dict[str, Any]:
        session = store.close(body.session_id)
        if session is None:
            raise HTTPException(
                status_code=404,
                detail=f"session_id: no open session {body.session_id!r} (never called, expired, or already closed)",
            )
        experiences = session_experiences(
            session, run_id=backend.run_id, reward=body.reward, components=body.components, group_id=body.group_id
        )
        try:
            accepted = backend.put(experiences)
        except Exception as err:  # noqa: BLE001 - any failure: keep the session so feedback can be retried
            store.reopen(session)  # nothing was lost: the application may post the feedback again
            log.warning("serve.put_failed", session_id=body.session_id, error=str(err))
            raise HTTPException(status_code=503, detail=f"the buffer did not take the experiences: {err}") from None
        return {"session_id": body.session_id, "experiences": len(experiences), "accepted": accepted}

    return app


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
