"""Redis at its `maxmemory`: a put is refused RESOURCE_EXHAUSTED naming the cause and stores nothing; the client backs
off and retries it; once memory is freed it lands, and nothing acknowledged before, during or after is lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import redis

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from trinity.buffer.keys import StreamKeys
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.client import open_channel
from trinity.runtime.errors import REDIS_FULL
from trinity.runtime.redis_server import RedisServer, start_redis_server
from trinity.v1 import buffer_pb2, buffer_pb2_grpc

STREAM = "full"
FILLER = "operator-filler"


@pytest.fixture
def full_redis() -> Iterator[tuple[RedisServer, ServiceProcess]]:
    server = start_redis_server()
    buffer = ServiceProcess("buffer", env={"TRINITY_REDIS_URL": server.url}).start()
    yield server, buffer
    buffer.stop()
    server.stop()


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_put_into_a_full_redis_is_refused_then_retried_until_memory_is_freed_and_nothing_is_lost(full_redis):
    server, buffer = full_redis
    client = redis.Redis.from_url(server.url)
    before = [experience(tokens=64) for _ in range(10)]
    during = [experience(tokens=64) for _ in range(10)]
    with BufferClient(buffer.address) as buffered:
        buffered.create_stream(StreamConfig(name=STREAM))
        assert buffered.put(STREAM, before).accepted == 10
        # Full: someone else's 2 MB, then a limit half a MB under what is used; deleting them frees room again.
        fillers = [f"{FILLER}:{i}" for i in range(32)]
        for key in fillers:
            client.set(key, b"x" * 64 * 1024)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 512 * 1024)
        keys = StreamKeys(STREAM)
        assert client.xlen(keys.stream) == 10

        stub = buffer_pb2_grpc.BufferServiceStub(open_channel(buffer.address))
        with pytest.raises(grpc.RpcError) as refused:
            stub.PutExperiences(buffer_pb2.PutExperiencesRequest(stream=STREAM, experiences=during), timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details().startswith(f"{REDIS_FULL} (")
        assert "maxmemory" in refused.value.details()
        assert client.xlen(keys.stream) == 10  # the refused put stored nothing

        # The client's put backs off and retries while Redis is full (each refusal is in the buffer's log) ...
        outcome: dict[str, object] = {}
        putter = threading.Thread(target=lambda: outcome.update(put=buffered.put(STREAM, during)), daemon=True)
        putter.start()
        _wait_for(lambda: buffer.logs().count('"redis.full"') >= 3, "the retried put to be refused again")
        assert "put" not in outcome
        # ... and lands once memory is freed.
        client.delete(*fillers)
        putter.join(timeout=60)
        assert not putter.is_alive()
        assert outcome["put"].accepted == 10

        batch = buffered.read(STREAM, "trainer", 100)
        assert sorted(e.id for e in batch.experiences) == sorted(e.id for e in before + during)
        assert buffered.stream(STREAM).stats.put == 20
