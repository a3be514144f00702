"""One gRPC server bootstrap for every service.

Health checking and server reflection are always on; a bearer-token interceptor guards every RPC except
health and reflection (Kubernetes probes cannot send headers) when a token is configured; SIGTERM drains.

No call starves the others. The server is a `grpc.aio` server whose event loop runs in a thread of its own:
- handlers written as plain functions (nearly all: short Redis or engine work) run in the server's thread pool
  of `workers` threads, exactly as under a synchronous server; `workers` bounds the calls doing synchronous work
  at one time, and calls beyond it queue for a thread;
- handlers that wait for a long time (`WatchRun`, a long-poll `ReadExperiences`) are coroutines: they wait on
  the loop (redis.asyncio) and hold no thread while they wait; their synchronous part runs in the pool
  (`trinity.runtime.aio.in_pool`);
- health, reflection and the token check are answered on the loop, so they answer however busy the pool is;
- a cancelled call's coroutine is cancelled at once, which drops what it held (its Redis connection with it).
Separate executors or per-client limits would only move the cliff (N streams per client, M clients), so the
waits got off threads instead. grpc.aio gives plain handlers a context without `is_active()` / `cancelled()`:
a handler that must notice a cancelled call is a coroutine.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import descriptor, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from trinity.runtime.corrupt import CorruptRequestInterceptor
from trinity.runtime.logging import get_logger
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.tenants import TenantBook

log = get_logger(__name__)

_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

_SERVER_OPTIONS = [
    # grpc turns SO_REUSEPORT on by default: a second server on a taken port then binds silently and takes a share
    # of its calls ("Method not found" from the wrong service). Off, the second bind fails and says so.
    ("grpc.so_reuseport", 0),
    # Long idle streams (WatchRun) are kept alive by client pings every 30 s; allow them.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` with UNAUTHENTICATED (on the loop: no thread). The
    token is the service's own, or a tenant's (`tenants`), which may call only `tenant_methods` (PERMISSION_DENIED
    for the rest: what services say to each other is theirs)."""

    def __init__(self, token: str, tenants: TenantBook | None = None, tenant_methods: frozenset[str] = frozenset()):
        self._expected = f"Bearer {token}".encode()
        self._tenants, self._tenant_methods = tenants or TenantBook(), tenant_methods
        self._unauthenticated = _denial(
            grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (set TRINITY_AUTH_TOKEN)"
        )
        self._services_only = _denial(
            grpc.StatusCode.PERMISSION_DENIED, "a tenant's token may call only the runs API; this is the services'"
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        if method.startswith(_OPEN_PREFIXES):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = str(metadata.get("authorization", ""))
        if hmac.compare_digest(presented.encode(), self._expected):
            return await continuation(handler_call_details)
        tenant = self._tenants.caller(presented)
        if tenant is not None and method in self._tenant_methods:
            return await continuation(handler_call_details)
        unary, stream = self._unauthenticated if tenant is None else self._services_only
        handler = await continuation(handler_call_details)
        return stream if handler is not None and handler.response_streaming else unary


def _denial(code: grpc.StatusCode, message: str) -> tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]:
    """Handlers (unary, server-streaming) that refuse every call with `code`."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(deny), grpc.unary_stream_rpc_method_handler(deny)


class MethodAwarePool:
    """The default descriptor pool for server reflection, which also finds the file of a method.

    `grpcurl describe pkg.Service.Method` asks reflection for the file containing the method's name, and
    protobuf's Python pool knows only messages, enums, services and extensions by name ("Symbol not found").
    """

    def __init__(self, pool: descriptor_pool.DescriptorPool | None = None) -> None:
        self._pool = pool or descriptor_pool.Default()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> descriptor.FileDescriptor:  # the pool's own API name
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service, _, method = symbol.rpartition(".")
            try:
                found = self._pool.FindServiceByName(service)
            except KeyError:
                pass
            else:
                if method in found.methods_by_name:
                    return found.file
            raise


def message_size_options(max_message_mb: int) -> list[tuple[str, int]]:
    size = max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]


@dataclass
class ServiceRegistration:
    """How a service plugs into the bootstrap: its servicer adder and its full service names.

    `on_shutdown` runs after the drain; `on_shutdown_async` then runs on the server's loop, for what the
    coroutine handlers used there (redis.asyncio clients). `current_run`: the run and stage a service that runs
    runs was last started on (`RunHost.current_run`), for its heartbeats. `tenants`: callers whose tokens the server
    accepts besides its own, for the full method names in `tenant_methods` only (the gateway's runs API)."""

    add_to_server: Callable[[grpc.aio.Server], None]
    service_names: Iterable[str]
    on_shutdown: Callable[[], None] | None = None
    on_shutdown_async: Callable[[], Coroutine[Any, Any, None]] | None = None
    current_run: Callable[[], tuple[str, int]] | None = None
    tenants: TenantBook | None = None
    tenant_methods: frozenset[str] = frozenset()


T = TypeVar("T")


class GrpcServer:
    """A started server: `port` is the bound one; `stop()` drains; `wait()` blocks until stopped.

    The grpc.aio server runs on an event loop in the thread `<service>-grpc`; plain handlers run in a pool of
    `settings.workers` threads, which is also the loop's default executor (`trinity.runtime.aio.in_pool`).
    """

    def __init__(self, settings: ServiceSettings, registration: ServiceRegistration) -> None:
        self.settings = settings
        self._registration = registration
        self.current_run = registration.current_run
        self._pool = futures.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix=settings.service)
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(self._pool)
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name=f"{settings.service}-grpc", daemon=True
        )
        self._loop_thread.start()
        self._server = self._on_loop(self._create_server())
        registration.add_to_server(self._server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        names = [*registration.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self._server, pool=MethodAwarePool())
        try:
            self.port = settings.tls.bind(self._server, f"{settings.host}:{settings.port}")
        except RuntimeError as err:  # grpc.aio raises where the synchronous server returned port 0
            raise RuntimeError(f"could not bind {settings.host}:{settings.port}; is the port already in use?") from err
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        # Held while health is set and while the loop closes, so that no set waits on a loop that is gone.
        self._loop_lock = threading.Lock()
        self._signal: int | None = None

    async def _create_server(self) -> grpc.aio.Server:
        """Made on the loop: grpc.aio binds a server to the loop running where it is created."""
        # The token is checked first: an unauthenticated caller learns nothing, not even that its bytes parse.
        interceptors: list[grpc.aio.ServerInterceptor] = [CorruptRequestInterceptor()]
        if self.settings.auth_token:
            registration = self._registration
            token = BearerTokenInterceptor(self.settings.auth_token, registration.tenants, registration.tenant_methods)
            interceptors.insert(0, token)
        return grpc.aio.server(
            migration_thread_pool=self._pool,
            interceptors=interceptors,
            options=[*message_size_options(self.settings.max_message_mb), *_SERVER_OPTIONS],
        )

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the server's loop and wait for it (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> GrpcServer:
        self._on_loop(self._server.start())
        self.set_serving(True)
        log.info("service.serving", port=self.port, instance_id=self.settings.instance_id)
        return self

    def set_serving(self, serving: bool) -> None:
        """Health of the server and its services; from any thread but the loop's, a no-op once stopped."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING

        async def apply() -> None:
            for name in ["", *self._registration.service_names]:
                await self.health.set(name, status)

        with self._loop_lock:
            if not self._loop.is_closed():
                self._on_loop(apply())

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish (up to `grace` s, then they are cancelled), then run
        the service's shutdown and close the loop."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            grace = self.settings.drain_seconds if grace is None else grace
            log.info("service.draining", grace_seconds=grace)
            self._on_loop(self.health.enter_graceful_shutdown())
            self._on_loop(self._server.stop(grace))
            if self._registration.on_shutdown is not None:
                self._registration.on_shutdown()
            if self._registration.on_shutdown_async is not None:
                self._on_loop(self._registration.on_shutdown_async())
            with self._loop_lock:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop_thread.join()
                self._loop.close()
            # A plain handler still running past the grace period finishes in its thread; no new one starts.
            self._pool.shutdown(wait=False, cancel_futures=True)
            # Releasing the server (and its calls' state, in cycles) shuts grpc.aio down, joining its poller
            # thread: one still alive at interpreter exit can abort the process ("FATAL: exception not rethrown").
            del self._server
            gc.collect()
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
    add_servicer: Callable[[Any, grpc.aio.Server], None],
    service_name: str,
    on_shutdown: Callable[[], None] | None = None,
    current_run: Callable[[], tuple[str, int]] | None = None,
) -> GrpcServer:
    registration = ServiceRegistration(
        add_to_server=lambda server: add_servicer(servicer, server),
        service_names=[service_name],
        on_shutdown=on_shutdown,
        current_run=current_run,
    )
    return GrpcServer(settings, registration).start()
