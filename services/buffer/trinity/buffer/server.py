"""Start the Buffer: Redis connection (with retries and a health watch), servicer, gRPC server."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from trinity.buffer.confinement import DataRoots
from trinity.buffer.metrics import register_gauges
from trinity.buffer.service import BufferServicer
from trinity.buffer.store import BufferStore
from trinity.buffer.wire import add_buffer_servicer_to_server
from trinity.runtime.aio import connect_redis_async
from trinity.runtime.logging import get_logger
from trinity.runtime.redis_server import connect_redis
from trinity.runtime.server import GrpcServer, ServiceRegistration, full_service_name
from trinity.runtime.settings import ServiceSettings
from trinity.v1 import buffer_pb2

log = get_logger(__name__)

SERVICE_NAME = full_service_name(buffer_pb2, "BufferService")


class RedisHealthWatch:
    """Marks the service NOT_SERVING while Redis does not answer, SERVING again once it does."""

    def __init__(self, client: redis.Redis, server: GrpcServer, interval: float = 1.0) -> None:
        self.client = client
        self.server = server
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        healthy = True
        probe = redis.Redis(connection_pool=self.client.connection_pool, retry=Retry(ExponentialBackoff(), 0))
        while not self._stop.wait(self.interval):
            try:
                probe.ping()
                ok = True
            except (redis.ConnectionError, redis.TimeoutError) as err:
                ok = False
                if healthy:
                    log.warning("redis.lost", error=str(err))
            if ok != healthy:
                healthy = ok
                self.server.set_serving(ok)
                if ok:
                    log.info("redis.recovered")


def build_buffer(settings: ServiceSettings) -> tuple[ServiceRegistration, BufferStore]:
    if not settings.redis_url:
        raise ValueError("the buffer needs Redis: set TRINITY_REDIS_URL or pass --redis-url")
    client = connect_redis(settings.redis_url)
    roots = DataRoots(settings.data_roots)
    # Rows come from local files only (trinity.buffer.rows checks every one is in the data roots); `datasets`,
    # which reads some of them, is told so too, so a dataset folder's README cannot send it to the Hub. And it
    # leaves torch alone where one is installed beside the buffer (a dev venv): its streams import it otherwise.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("USE_TORCH", "0")
    log.info("buffer.data_roots", roots=[str(root) for root in roots.roots])
    store = BufferStore(client, roots)
    waits = connect_redis_async(settings.redis_url)
    servicer = BufferServicer(store, settings.instance_id, waits)
    registration = ServiceRegistration(
        add_to_server=lambda server: add_buffer_servicer_to_server(servicer, server),
        service_names=[SERVICE_NAME],
        on_shutdown=client.close,
        on_shutdown_async=waits.aclose,
    )
    return registration, store


# glibc mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 32 << 20


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep large freed blocks for reuse; True if it took the settings.

    Every put and read moves about 0.5 MB messages (a batch of 64 experiences), several copies each
    (gRPC's buffers, the request, the reply). By default glibc serves blocks that large with mmap and
    hands them back to the kernel when they are freed (or trims them off the heap), so the next call
    page-faults them in again: measured 15-20% of the Buffer process's CPU on the benchmark
    (docs/benchmarks.md). With these settings blocks under 16 MiB come from the heap and up to 32 MiB
    of free heap is kept. A no-op off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def start_buffer(settings: ServiceSettings) -> GrpcServer:
    keep_freed_memory()
    registration, store = build_buffer(settings)
    server = GrpcServer(settings, registration).start()
    register_gauges(store)
    watch = RedisHealthWatch(store.client, server)
    watch.start()
    previous = registration.on_shutdown

    def shutdown() -> None:
        watch.stop()
        if previous is not None:
            previous()

    registration.on_shutdown = shutdown
    return server
