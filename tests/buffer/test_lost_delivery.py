"""A delivery whose reply never reached its consumer (the connection dropped after Redis or the buffer answered):
each read tells the consumer how many entries are pending under its name, and the consumer hands back those it does
not hold, for its next read, instead of waiting out `claim_idle_ms` (10 min by default) for them."""

from __future__ import annotations

from tests.buffer.helpers import experience
from trinity.buffer.streams.experience_stream import DeliveredEntry
from trinity.buffer.wire import encode_read_response
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.v1 import buffer_pb2


def test_the_read_response_carries_the_consumers_pending_count():
    entry = DeliveredEntry("1-0", 1, experience(id="a").SerializeToString(deterministic=True))
    encoded = encode_read_response([entry], consumer_pending=7)
    assert buffer_pb2.ReadExperiencesResponse.FromString(encoded).consumer_pending == 7


def test_a_lost_delivery_is_handed_back_and_what_the_consumer_holds_stays(buffer_service, unique):
    with BufferClient(buffer_service.address) as client:
        client.create_stream(StreamConfig(name=unique))  # the default claim_idle_ms: 10 minutes
        client.put(unique, [experience() for _ in range(6)])
        held = client.read(unique, "trainer", 2)  # trained, acknowledged with the next checkpoint
        lost = client.read(unique, "trainer", 2)  # delivered; its reply never arrived
        got = client.read(unique, "trainer", 2)
        keep = [*held.entry_ids, *got.entry_ids]
        assert got.consumer_pending == 6 > len(keep)

        assert client.nack(unique, "trainer", all_pending=True, keep=keep) == 2
        again = client.read(unique, "trainer", 2)
        assert sorted(again.entry_ids) == sorted(lost.entry_ids) and again.reclaimed == 2
        assert again.consumer_pending == 6  # the consumer now holds all six
        assert client.ack(unique, [*keep, *again.entry_ids]) == 6


def test_stale_entries_a_read_dropped_are_not_counted_as_held(buffer_service, unique):
    with BufferClient(buffer_service.address) as client:
        client.create_stream(StreamConfig(name=unique))
        client.put(unique, [experience(model_version=0) for _ in range(3)])
        got = client.read(unique, "trainer", 3, min_model_version=1)
        assert (len(got), got.dropped_stale, got.consumer_pending) == (0, 3, 0)
