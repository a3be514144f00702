"""Watching a run: the watchers of one run share one reader of its events (RunStore.watch), on real Redis."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import grpc
import pytest
import redis
import redis.asyncio

from tests.conftest import ServiceProcess
from tests.runtime.redis_waits import blocked_reads
from trinity.gateway import runs
from trinity.gateway.runs import RunStore
from trinity.runtime.client import open_channel
from trinity.v1 import gateway_pb2, gateway_pb2_grpc

T = TypeVar("T")


@pytest.fixture
def store(redis_server) -> RunStore:
    return RunStore(redis.Redis.from_url(redis_server.url), redis.asyncio.Redis.from_url(redis_server.url))


def _run(store: RunStore, scenario: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            return await scenario
        finally:
            await store.waits.aclose()

    return asyncio.run(main())


def _log(store: RunStore, run_id: str, n: int) -> list[str]:
    return [
        store.append_event(gateway_pb2.RunEvent(run_id=run_id, kind=gateway_pb2.EVENT_KIND_LOG, message=f"m{i}"))
        for i in range(n)
    ]


def _finish(store: RunStore, run: gateway_pb2.Run) -> str:
    run.state = gateway_pb2.RUN_STATE_SUCCEEDED
    store.save(run)
    return store.append_event(gateway_pb2.RunEvent(run_id=run.id, kind=gateway_pb2.EVENT_KIND_STATE, state=run.state))


async def _take(events: AsyncIterator[gateway_pb2.RunEvent], n: int) -> list[str]:
    return [(await anext(events)).seq for _ in range(n)]


async def _rest(events: AsyncIterator[gateway_pb2.RunEvent]) -> list[str]:
    return [event.seq async for event in events]


def test_each_watcher_gets_every_event_after_its_position_once_and_in_order(store, unique):
    run = store.create(unique, "{}")

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        first = _log(store, run.id, 3)
        from_start, from_second = store.watch(run.id), store.watch(run.id, first[1])
        head = await _take(from_start, 3)
        later = _log(store, run.id, 2)
        middle = await _take(from_second, 3)
        last = _finish(store, run)
        return head + await _rest(from_start), middle + await _rest(from_second), [*first, *later, last]

    whole, second, written = _run(store, scenario())
    assert whole == written
    assert second == written[2:]


def test_a_watcher_behind_what_the_feed_holds_catches_up_from_redis(store, unique, monkeypatch):
    monkeypatch.setattr(runs, "FEED_EVENTS", 4)
    run = store.create(unique, "{}")

    async def scenario() -> tuple[list[str], list[str]]:
        written = _log(store, run.id, 1)
        leader, laggard = store.watch(run.id), store.watch(run.id)
        await _take(leader, 1)
        await _take(laggard, 1)  # both watch the run now
        written += _log(store, run.id, 12)
        await _take(leader, 12)  # the feed holds the last 4 of them, far ahead of the laggard
        written.append(_finish(store, run))
        await _rest(leader)
        return written[1:], await _rest(laggard)

    expected, caught_up = _run(store, scenario())
    assert caught_up == expected


def test_the_reader_stops_waiting_on_redis_when_its_last_watcher_leaves(store, unique, redis_server):
    run = store.create(unique, "{}")

    async def scenario() -> tuple[int, int]:
        watchers = [asyncio.create_task(_rest(store.watch(run.id))) for _ in range(3)]
        while not (waiting := blocked_reads(redis_server.url, os.getpid())):  # until the reader waits for an event
            await asyncio.sleep(0.05)
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        while blocked_reads(redis_server.url, os.getpid()):  # the test's deadline bounds this
            await asyncio.sleep(0.05)
        return waiting, blocked_reads(redis_server.url, os.getpid())

    assert _run(store, scenario()) == (1, 0)  # one reader for three watchers, gone with them
    _finish(store, run)  # no active run left behind in the shared Redis


def test_a_malformed_after_seq_is_invalid_argument_naming_the_field(redis_server):
    gateway = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis_server.url}).start()
    try:
        with open_channel(gateway.address) as channel, pytest.raises(grpc.RpcError) as info:
            request = gateway_pb2.WatchRunRequest(run_id="r", after_seq="not-a-seq")
            list(gateway_pb2_grpc.GatewayServiceStub(channel).WatchRun(request, timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "after_seq" in info.value.details()
    finally:
        gateway.stop()
