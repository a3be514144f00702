"""Fixtures of the gateway tests that drive runs through `run_harness.Gateway` (in-process services, real Redis)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
import redis

from tests.gateway.run_harness import FakeService, Gateway
from trinity.gateway.service import GatewayServicer
from trinity.runtime.redis_server import RedisServer, start_redis_server
from trinity.v1 import gateway_pb2_grpc


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the module's own: the session's is shared with gateway processes whose monitors would act on
    these runs too."""
    server = start_redis_server()
    yield server
    server.stop()


@pytest.fixture
def harness(own_redis, buffer_service) -> Iterator[Gateway]:
    """A gateway's run machinery in this process, on an emptied Redis of the module's own and the session's buffer."""
    redis.Redis.from_url(own_redis.url).flushall()
    gateway = Gateway(own_redis.url, buffer_service.address)
    yield gateway
    gateway.close()


@pytest.fixture
def add_service(harness) -> Iterator[Callable[[str], FakeService]]:
    """Another explorer or trainer process registers with the gateway, free for any run."""
    added: list[FakeService] = []

    def add(service: str) -> FakeService:
        added.append(FakeService(service))
        harness.register(added[-1], started=1)
        return added[-1]

    yield add
    for fake in added:
        fake.server.stop(None)


@pytest.fixture
def add_explorer(add_service) -> Callable[[], FakeService]:
    return lambda: add_service("explorer")


@pytest.fixture
def address(harness) -> Iterator[str]:
    """The harness's orchestrator behind the gateway's servicer, on a real gRPC server."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(GatewayServicer(harness.orchestrator, "gateway-t"), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)
