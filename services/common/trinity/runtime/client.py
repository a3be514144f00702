"""Client helpers: channels with auth and TLS, message size limits, retries with backoff and default deadlines."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import tenacity

from trinity.runtime.errors import REDIS_FULL
from trinity.runtime.logging import get_logger
from trinity.runtime.server import message_size_options
from trinity.runtime.settings import auth_token
from trinity.runtime.tls import TlsSettings

log = get_logger(__name__)

T = TypeVar("T")

# gRPC's own retry machinery: transient UNAVAILABLE is retried with exponential backoff.
_RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


class _AuthInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)


def _channel_options(max_message_mb: int, tls: TlsSettings) -> list[tuple[str, Any]]:
    return [
        *message_size_options(max_message_mb),
        ("grpc.service_config", _RETRY_SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", 30_000),
        *tls.channel_options(),
    ]


def open_channel(
    target: str, *, token: str | None = None, tls: TlsSettings | None = None, max_message_mb: int = 256
) -> grpc.Channel:
    """A channel to `target` (host:port) with retries; TLS as `tls` says (default: the `TRINITY_TLS_*`
    variables, see trinity.runtime.tls); `token` defaults to TRINITY_AUTH_TOKEN."""
    token = auth_token(token)
    tls = tls if tls is not None else TlsSettings.from_env()
    options = _channel_options(max_message_mb, tls)
    if tls.dials_tls:
        channel = grpc.secure_channel(target, tls.channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _AuthInterceptor(token))
    return channel


def open_async_channel(target: str, *, tls: TlsSettings | None = None, max_message_mb: int = 256) -> grpc.aio.Channel:
    """The asyncio twin of `open_channel`, without the token: asyncio callers send it as call metadata."""
    tls = tls if tls is not None else TlsSettings.from_env()
    options = _channel_options(max_message_mb, tls)
    if tls.dials_tls:
        return grpc.aio.secure_channel(target, tls.channel_credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)


def wait_until_serving(
    target: str, *, timeout: float = 30.0, service: str = "", token: str | None = None, tls: TlsSettings | None = None
) -> None:
    """Block until the health service at `target` reports SERVING, or raise TimeoutError."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with open_channel(target, token=token, tls=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as err:
                last = err
            time.sleep(0.1)
    raise TimeoutError(f"{target} did not report SERVING within {timeout:.0f}s (last error: {last})")


def _redis_full(err: BaseException) -> bool:
    return (
        isinstance(err, grpc.RpcError)
        and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and (err.details() or "").startswith(REDIS_FULL)
    )


def outage_seconds() -> float:
    """How long a client keeps retrying a service that is unreachable (`TRINITY_OUTAGE_SECONDS`, default 60):
    long enough to ride out a restart of the gateway, the buffer or Redis (a few seconds each here)."""
    return float(os.environ.get("TRINITY_OUTAGE_SECONDS", "60"))


def call_with_retry(
    fn: Callable[[], T],
    *,
    within: float | None = None,
    retry_on: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED),
) -> T:
    """`fn()`, retried with exponential backoff (0.1 s doubling to 2 s) while it fails with a transient status
    (`retry_on`, or a Redis at its `maxmemory`: `REDIS_FULL`), for up to `within` seconds (default
    `outage_seconds()`); for calls that are safe to repeat."""

    def transient(err: BaseException) -> bool:
        return isinstance(err, grpc.RpcError) and (err.code() in retry_on or _redis_full(err))

    def report(state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        if err is not None and _redis_full(err):
            log.warning("buffer.redis_full", attempt=state.attempt_number, retry_in_s=round(state.upcoming_sleep, 2))

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(transient),
        before_sleep=report,
        wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
        stop=tenacity.stop_after_delay(outage_seconds() if within is None else within),
        reraise=True,
    )
    return retrying(fn)
