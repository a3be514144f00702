"""One gRPC server bootstrap for every service.

Health checking and server reflection are always on; a bearer-token interceptor guards every RPC except
health and reflection (Kubernetes probes cannot send headers) when a token is configured; SIGTERM drains.
"""

from __future__ import annotations

import hmac
import signal
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from trinity.runtime.logging import get_logger
from trinity.runtime.settings import ServiceSettings

log = get_logger(__name__)

_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

# Long idle streams (WatchRun) are kept alive by client pings every 30 s; allow them.
_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(_request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (set TRINITY_AUTH_TOKEN)")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        if method.startswith(_OPEN_PREFIXES):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = str(metadata.get("authorization", "")).encode()
        if hmac.compare_digest(presented, self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is not None and handler.response_streaming:
            return self._deny_stream
        return self._deny


def message_size_options(max_message_mb: int) -> list[tuple[str, int]]:
    size = max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]


@dataclass
class ServiceRegistration:
    """How a service plugs into the bootstrap: its servicer adder and its full service names."""

    add_to_server: Callable[[grpc.Server], None]
    service_names: Iterable[str]
    on_shutdown: Callable[[], None] | None = None


class GrpcServer:
    """A started server: `port` is the bound one; `stop()` drains; `wait()` blocks until stopped."""

    def __init__(self, settings: ServiceSettings, registration: ServiceRegistration) -> None:
        self.settings = settings
        self._registration = registration
        interceptors = [BearerTokenInterceptor(settings.auth_token)] if settings.auth_token else []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix=settings.service),
            interceptors=interceptors,
            options=[*message_size_options(settings.max_message_mb), *_KEEPALIVE_OPTIONS],
        )
        registration.add_to_server(self._server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        names = [*registration.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self._server)
        self.port = self._server.add_insecure_port(f"{settings.host}:{settings.port}")
        if self.port == 0:
            raise RuntimeError(f"could not bind {settings.host}:{settings.port}; is the port already in use?")
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._signal: int | None = None

    def start(self) -> GrpcServer:
        self._server.start()
        self.set_serving(True)
        log.info("service.serving", port=self.port, instance_id=self.settings.instance_id)
        return self

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._registration.service_names]:
            self.health.set(name, status)

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish (up to `grace` s), then run the service's shutdown."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            grace = self.settings.drain_seconds if grace is None else grace
            log.info("service.draining", grace_seconds=grace)
            self.health.enter_graceful_shutdown()
            self._server.stop(grace).wait()
            if self._registration.on_shutdown is not None:
                self._registration.on_shutdown()
            self._stopped.set()
            log.info("service.stopped")

    def wait(self) -> None:
        """Block until stopped; a SIGTERM/SIGINT received meanwhile drains the server from here."""
        while not self._stopped.wait(0.2):
            if self._signal is not None:
                log.info("service.signal", signal=signal.Signals(self._signal).name)
                self.stop()

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT only record the signal: the waiting main thread does the drain (a handler
        that logs or starts threads can deadlock on locks the interrupted code holds)."""

        def handle(signum: int, _frame: object) -> None:
            self._signal = signum

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)


def full_service_name(proto_module: Any, service: str) -> str:
    """`trinity.v1.BufferService` from a generated *_pb2 module and the service's short name."""
    return str(proto_module.DESCRIPTOR.services_by_name[service].full_name)


def start_grpc_service(
    settings: ServiceSettings,
    servicer: Any,
    add_servicer: Callable[[Any, grpc.Server], None],
    service_name: str,
    on_shutdown: Callable[[], None] | None = None,
) -> GrpcServer:
    registration = ServiceRegistration(
        add_to_server=lambda server: add_servicer(servicer, server),
        service_names=[service_name],
        on_shutdown=on_shutdown,
    )
    return GrpcServer(settings, registration).start()
