"""Entries a trainer holds between its train step and the checkpoint that acknowledges them (`save_interval` steps
later): renewed after each step, no read reclaims them however long the steps take; without the renewal a read
reclaims them once they have been idle `claim_idle_ms`, and they would be trained again."""

from __future__ import annotations

import redis

from tests.buffer.helpers import experience
from trinity.buffer.keys import StreamKeys
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.limits import MAX_ITEMS

IDLE_MS = 60_000


def _age(redis_url: str, stream: str, consumer: str, entry_ids: list[str]) -> None:
    """Make entries look idle past `IDLE_MS` (as after slow steps) without waiting: XCLAIM's IDLE sets their idle
    time, JUSTID leaves their delivery count."""
    group = StreamConfig(name=stream).group
    client = redis.Redis.from_url(redis_url)
    client.xclaim(StreamKeys(stream).stream, group, consumer, 0, entry_ids, idle=IDLE_MS + 1, justid=True)


def test_renewed_entries_are_not_reclaimed_and_unrenewed_ones_are(buffer_service, redis_server, unique):
    with BufferClient(buffer_service.address) as client:
        client.create_stream(StreamConfig(name=unique, claim_idle_ms=IDLE_MS))
        client.put(unique, [experience() for _ in range(4)])
        trained = client.read(unique, "trainer", 4).entry_ids
        renewed, unrenewed = trained[:2], trained[2:]
        _age(redis_server.url, unique, "trainer", trained)

        assert client.renew(unique, "trainer", renewed) == 2
        other = client.read(unique, "trainer-2", 4)
        assert sorted(other.entry_ids) == sorted(unrenewed) and other.reclaimed == 2


def test_renewal_never_takes_an_entry_another_consumer_holds_or_one_acknowledged(buffer_service, unique):
    with BufferClient(buffer_service.address) as client:
        client.create_stream(StreamConfig(name=unique, claim_idle_ms=IDLE_MS))
        client.put(unique, [experience() for _ in range(2)])
        mine = client.read(unique, "trainer", 1).entry_ids
        theirs = client.read(unique, "trainer-2", 1).entry_ids
        assert client.renew(unique, "trainer", [*mine, *theirs]) == 1
        assert client.ack(unique, mine) == 1
        assert client.renew(unique, "trainer", mine) == 0
        assert client.nack(unique, "trainer-2", all_pending=True) == 1  # still trainer-2's to hand back


def test_more_entries_than_one_request_takes_are_renewed_and_acknowledged(buffer_service, unique):
    """A trainer holds `save_interval` batches until its checkpoint: 10 x 1,024 is over a request's 10,000 ids."""
    held = MAX_ITEMS + 5
    with BufferClient(buffer_service.address) as client:
        client.create_stream(StreamConfig(name=unique))
        for first in range(0, held, 5_000):
            client.put(unique, [experience() for _ in range(first, min(first + 5_000, held))])
        entry_ids: list[str] = []
        while len(entry_ids) < held:
            entry_ids += client.read(unique, "trainer", 5_000).entry_ids
        assert client.renew(unique, "trainer", entry_ids) == held
        assert client.ack(unique, entry_ids) == held
