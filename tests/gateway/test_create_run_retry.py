"""CreateRun repeated with its request id, as gRPC's retry policy repeats a call whose connection dropped after the
gateway had created the run: one run, one "run accepted", the same answer to every attempt."""

from __future__ import annotations

import contextlib
import uuid

import grpc
import pytest
import redis
import redis.asyncio

from tests.e2e.conftest import tiny_config
from trinity.gateway import keys, runs
from trinity.gateway.runs import RunStore
from trinity.runtime.client import open_channel
from trinity.runtime.errors import Unavailable
from trinity.sdk import TrinityClient
from trinity.sdk.client import config_text
from trinity.v1 import gateway_pb2, gateway_pb2_grpc


@pytest.fixture
def create(gateway):
    """CreateRun on the session's gateway with a request id; every run made is cancelled after the test, as the
    gateway refuses new runs beyond its limit of pending ones and the tests share it."""
    made: set[str] = set()

    def _create(config: dict, request_id: str, run_id: str = "") -> gateway_pb2.Run:
        request = gateway_pb2.CreateRunRequest(config_yaml=config_text(config), run_id=run_id, request_id=request_id)
        with open_channel(gateway.address) as channel:
            run = gateway_pb2_grpc.GatewayServiceStub(channel).CreateRun(request, timeout=30)
        made.add(run.id)
        return run

    yield _create
    with TrinityClient(gateway.address) as client:
        for run_id in made:
            client.run(run_id).cancel("test over")


def _events(address: str, run_id: str) -> list[gateway_pb2.RunEvent]:
    """The events of a pending run so far (its watch only ends with the run: cut after a second)."""
    events: list[gateway_pb2.RunEvent] = []
    with open_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayServiceStub(channel).WatchRun(
            gateway_pb2.WatchRunRequest(run_id=run_id), timeout=1.0
        )
        with contextlib.suppress(grpc.RpcError):  # DEADLINE_EXCEEDED: the cut
            events.extend(call)
    return events


def test_a_repeated_request_gets_the_run_the_first_created(gateway, create, tmp_path, unique):
    config = tiny_config(tmp_path / "model", name=unique)
    first, again = create(config, f"{unique}-r1"), create(config, f"{unique}-r1")
    assert again.id == first.id
    with TrinityClient(gateway.address) as client:
        mine = [run.id for run in client.list_runs() if run.name == unique]
    assert mine == [first.id]
    assert [e.message for e in _events(gateway.address, first.id)].count("run accepted") == 1


def test_a_repeated_request_with_a_run_id_gets_that_run_not_already_exists(create, tmp_path, unique):
    config = tiny_config(tmp_path / "model")
    assert create(config, f"{unique}-r2", unique).id == create(config, f"{unique}-r2", unique).id == unique


def test_requests_of_their_own_create_runs_of_their_own(create, tmp_path, unique):
    config = tiny_config(tmp_path / "model", name=unique)
    assert create(config, f"{unique}-r3").id != create(config, f"{unique}-r4").id


def test_a_request_refused_is_refused_again_not_answered_with_the_run_in_the_way(create, tmp_path, unique):
    config = tiny_config(tmp_path / "model")
    create(config, f"{unique}-r5", unique)
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as info:
            create(config, f"{unique}-r6", unique)
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_a_request_whose_first_attempt_died_before_writing_its_run_is_freed_for_a_retry(redis_server, monkeypatch):
    client = redis.Redis.from_url(redis_server.url)
    store = RunStore(client, redis.asyncio.Redis.from_url(redis_server.url))
    request_id = uuid.uuid4().hex
    client.set(keys.create_request(request_id), "first-attempt never-written-run")  # its gateway died here
    monkeypatch.setattr(runs, "CREATE_REQUEST_WAIT_S", 0.2)
    with pytest.raises(Unavailable, match="did not write run 'never-written-run'; retry"):
        store.create_once("tiny", "{}", request_id=request_id)
    run, created = store.create_once("tiny", "{}", request_id=request_id)
    assert created and store.get(run.id) == run
    client.close()
