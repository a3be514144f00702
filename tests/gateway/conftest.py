"""Fixtures of the gateway tests that drive runs through `run_harness.Gateway` (in-process services, real Redis)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.gateway.run_harness import Gateway
from trinity.runtime.redis_server import RedisServer, start_redis_server


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
