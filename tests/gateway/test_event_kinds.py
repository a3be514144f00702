"""Event kinds travel as `EventKind`: a report without a known one is refused, and events recorded while the kind
was text read back with their kind."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import redis
import redis.asyncio

from trinity.gateway import keys
from trinity.gateway.runs import RunStore
from trinity.runtime.client import open_channel
from trinity.v1 import gateway_pb2, gateway_pb2_grpc


@pytest.mark.parametrize("kind", [gateway_pb2.EVENT_KIND_UNSPECIFIED, 99])
def test_a_report_without_a_known_event_kind_is_refused_naming_the_field(gateway, unique, kind):
    event = gateway_pb2.RunEvent(run_id=unique, kind=kind, source="trainer/t")
    with open_channel(gateway.address) as channel, pytest.raises(grpc.RpcError) as info:
        gateway_pb2_grpc.GatewayServiceStub(channel).ReportEvent(
            gateway_pb2.ReportEventRequest(event=event), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "event.kind" in info.value.details()


def test_an_event_recorded_with_its_kind_as_text_reads_back_as_that_event_kind(redis_server, unique):
    client = redis.Redis.from_url(redis_server.url)
    store = RunStore(client, redis.asyncio.Redis.from_url(redis_server.url))
    run = store.create(unique, "{}", run_id=unique)
    store.append_event(gateway_pb2.RunEvent(run_id=unique, kind=gateway_pb2.EVENT_KIND_STATE, state=run.state))
    # As a gateway before EventKind recorded it: field 3 (now reserved) held the kind as a string.
    old = gateway_pb2.RunEvent(run_id=unique, step=2).SerializeToString(deterministic=True) + b"\x1a\x05train"

    async def watch() -> gateway_pb2.RunEvent:
        try:
            events = store.watch(unique)
            await anext(events)  # the watch is under way
            client.xadd(keys.events(unique), {"e": old})
            event = await anext(events)
            run.state = gateway_pb2.RUN_STATE_SUCCEEDED
            store.save(run)
            store.append_event(gateway_pb2.RunEvent(run_id=unique, kind=gateway_pb2.EVENT_KIND_STATE, state=run.state))
            assert [e.kind async for e in events] == [gateway_pb2.EVENT_KIND_STATE]
            return event
        finally:
            await store.waits.aclose()

    event = asyncio.run(watch())
    assert (event.kind, event.step) == (gateway_pb2.EVENT_KIND_TRAIN, 2)
    assert event.SerializeToString(deterministic=True) == gateway_pb2.RunEvent(
        run_id=unique, kind=gateway_pb2.EVENT_KIND_TRAIN, step=2, seq=event.seq
    ).SerializeToString(deterministic=True)  # the old text is gone: watchers receive the event as it is now
    client.close()
