"""Client helpers: channels with auth, message size limits, retries with backoff and default deadlines."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from trinity.runtime.server import message_size_options

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


def open_channel(target: str, *, token: str | None = None, max_message_mb: int = 256) -> grpc.Channel:
    """An insecure channel to `target` (host:port) with retries; `token` defaults to TRINITY_AUTH_TOKEN."""
    token = token if token is not None else os.environ.get("TRINITY_AUTH_TOKEN") or None
    options = [
        *message_size_options(max_message_mb),
        ("grpc.service_config", _RETRY_SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", 30_000),
    ]
    channel = grpc.insecure_channel(target, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _AuthInterceptor(token))
    return channel


def wait_until_serving(target: str, *, timeout: float = 30.0, service: str = "", token: str | None = None) -> None:
    """Block until the health service at `target` reports SERVING, or raise TimeoutError."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with open_channel(target, token=token) as channel:
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


def call_with_retry(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    initial_backoff: float = 0.1,
    max_backoff: float = 2.0,
    retry_on: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED),
) -> T:
    """Retry `fn` on transient gRPC errors with exponential backoff (for calls that are safe to repeat)."""
    backoff = initial_backoff
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except grpc.RpcError as err:
            if attempt == attempts or err.code() not in retry_on:
                raise
            time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
    raise AssertionError("unreachable")
