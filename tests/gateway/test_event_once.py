"""A report retried after a lost reply is recorded once."""

from __future__ import annotations

import redis
import redis.asyncio

from trinity.gateway import keys
from trinity.gateway.runs import RunStore
from trinity.v1 import gateway_pb2


def test_an_event_reported_twice_under_one_id_is_recorded_once(redis_server, unique):
    client = redis.Redis.from_url(redis_server.url)
    store = RunStore(client, redis.asyncio.Redis.from_url(redis_server.url))
    event = gateway_pb2.RunEvent(run_id=unique, kind=gateway_pb2.EVENT_KIND_TRAIN, step=3, event_id="e-1")
    first, first_new = store.append_once(event)
    again, again_new = store.append_once(event)
    other, other_new = store.append_once(
        gateway_pb2.RunEvent(run_id=unique, kind=gateway_pb2.EVENT_KIND_TRAIN, step=4, event_id="e-2")
    )
    assert (first_new, again_new, other_new) == (True, False, True)
    assert again == first and other != first
    assert client.xlen(keys.events(unique)) == 2
    client.close()
