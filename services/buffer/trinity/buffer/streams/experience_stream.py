"""One experience stream: a Redis Stream read through a consumer group.

Delivery is at-least-once: an entry leaves the pending list only when acknowledged (after the train
step that used it is committed). Entries a dead consumer left pending are reclaimed by a live one;
entries delivered more than `max_deliveries` times move to a dead-letter stream.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, cast

import redis
import redis.asyncio

from trinity.buffer.keys import STREAMS, StreamKeys
from trinity.buffer.operators import OperatorContext, apply_operators
from trinity.buffer.streams import resp, scripts
from trinity.config import StreamConfig
from trinity.v1 import common_pb2


class StreamStats(TypedDict):
    """The fields of `trinity.v1.StreamStats`: counters since creation and the group's state now."""

    length: int
    pending: int
    lag: int
    consumers: int
    dead_letters: int
    put: int
    delivered: int
    acked: int
    dropped: dict[str, int]


@dataclass
class DeliveredEntry:
    entry_id: str
    deliveries: int
    payload: bytes


@dataclass
class ReadResult:
    entries: list[DeliveredEntry] = field(default_factory=list)
    dropped_stale: int = 0
    reclaimed: int = 0
    dead_lettered: int = 0
    consumer_pending: int = 0  # entries pending under the consumer after the read, `entries` included


@dataclass
class PutResult:
    accepted: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    entry_ids: list[str] = field(default_factory=list)


class ExperienceStream:
    def __init__(self, client: redis.Redis, config: StreamConfig) -> None:
        self.client = client
        self.config = config
        self.keys = StreamKeys(config.name)
        self._put = client.register_script(scripts.PUT)
        self._replay = client.register_script(scripts.REPLAY)

    # ---- lifecycle -------------------------------------------------------------------------------

    def create(self) -> None:
        """Create the stream and its consumer group (idempotent) and remember the spec."""
        pipe = self.client.pipeline()
        pipe.set(self.keys.spec, self.config.model_dump_json())
        pipe.sadd(STREAMS, self.config.name)
        pipe.execute()
        try:
            self.client.xgroup_create(self.keys.stream, self.config.group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def delete(self) -> None:
        pipe = self.client.pipeline()
        pipe.delete(*self.keys.all())
        pipe.srem(STREAMS, self.config.name)
        pipe.execute()

    # ---- write -----------------------------------------------------------------------------------

    def put(
        self,
        experiences: Sequence[common_pb2.Experience],
        ctx: OperatorContext | None = None,
        *,
        apply_stream_operators: bool = True,
        payloads: Sequence[bytes | memoryview] | None = None,
    ) -> PutResult:
        """Operators, then dedupe by experience id, then append, atomically for the whole batch.

        `payloads[i]`, when given, is `experiences[i]` serialized (as the client sent it); it is stored
        instead of serializing again, unless operators ran (they may change what they keep).
        """
        result = PutResult()
        kept: Sequence[common_pb2.Experience] = experiences
        if apply_stream_operators and self.config.operators:
            applied = apply_operators(experiences, self.config.operators, ctx or OperatorContext())
            kept, result.dropped = applied.kept, applied.dropped
            self._count_drops(result.dropped)
            payloads = None
        if not kept:
            return result
        if payloads is None:
            payloads = [e.SerializeToString(deterministic=True) for e in kept]
        appended = None if self.config.priority_replay.enabled else self._append_optimistic(kept, payloads)
        if appended is None:
            appended = self._append_scripted(kept, payloads)
        accepted, duplicates, result.entry_ids = appended
        result.accepted = accepted
        if duplicates:
            result.dropped["duplicate"] += duplicates
        if self.config.max_len and self.client.xlen(self.keys.stream) > self.config.max_len * 1.1:
            self.trim()
        return result

    def _append_optimistic(
        self, experiences: Sequence[common_pb2.Experience], payloads: Sequence[bytes | memoryview]
    ) -> tuple[int, int, list[str]] | None:
        """Dedupe and append in one MULTI, valid only if no other put touched the seen-set meanwhile
        (WATCH); None when one did, and the caller falls back to the PUT script.

        One round trip when no id was seen before (the usual case): WATCH, the FRESH script, which makes
        the MULTI abort if some id was seen, and the MULTI appending them all. Otherwise a second try
        looks the ids up first (WATCH and ZMSCORE), then appends only the new ones.
        """
        now_ms = int(time.time() * 1000)
        expired_before = now_ms - int(self.config.dedupe_ttl_seconds * 1000)
        keys = self.keys
        ids = [e.id for e in experiences]
        stream_key = resp.bulk(keys.stream)

        def append(fresh: dict[str, tuple[int, bytes | memoryview]], duplicates: int) -> resp.Multi:
            commands: list[resp.Command] = [("ZREMRANGEBYSCORE", keys.seen, "-inf", expired_before)]
            if fresh:
                zadd: list[resp.Arg] = ["ZADD", keys.seen]
                for experience_id in fresh:
                    zadd += (now_ms, experience_id)
                commands.append(zadd)
            for experience_id, (version, payload) in fresh.items():
                commands.append(_xadd(stream_key, experience_id, version, payload))
            if fresh:
                commands.append(("HINCRBY", keys.stats, "put", len(fresh)))
            if duplicates:
                commands.append(("HINCRBY", keys.stats, "dropped:duplicate", duplicates))
            return resp.Multi(commands)

        def appended(executed: list, fresh: int, duplicates: int) -> tuple[int, int, list[str]]:
            first = 2 if fresh else 1  # after ZREMRANGEBYSCORE and ZADD
            return fresh, duplicates, [_text(x) for x in executed[first : first + fresh]]

        def attempt(session: resp.Session) -> tuple[int, int, list[str]] | None:
            if len(set(ids)) == len(ids):  # no id twice in the batch: try all of them at once
                every = {e.id: (e.model_version, payload) for e, payload in zip(experiences, payloads, strict=True)}
                _, seen, executed = session.call(
                    [
                        ("WATCH", keys.seen, keys.put_guard),
                        ("EVAL", scripts.FRESH, 2, keys.seen, keys.put_guard, expired_before, *ids),
                        append(every, 0),
                    ]
                )
                if executed is not None:
                    return appended(executed, len(every), 0)
                if not seen:  # nothing seen before, so another put touched the seen-set meanwhile
                    return None
            _, scores = session.call([("WATCH", keys.seen), ("ZMSCORE", keys.seen, *ids)])
            fresh: dict[str, tuple[int, bytes | memoryview]] = {}  # first occurrence of each id not seen before
            for i, (experience_id, score) in enumerate(zip(ids, scores, strict=True)):
                if (score is None or float(score) <= expired_before) and experience_id not in fresh:
                    fresh[experience_id] = (experiences[i].model_version, payloads[i])
            duplicates = len(experiences) - len(fresh)
            (executed,) = session.call([append(fresh, duplicates)])  # errors, also a refused MULTI, are raised
            if executed is None:  # a watched key changed: nothing was applied
                return None
            return appended(executed, len(fresh), duplicates)

        return resp.run(self.client, attempt)

    def _append_scripted(
        self, experiences: Sequence[common_pb2.Experience], payloads: Sequence[bytes | memoryview]
    ) -> tuple[int, int, list[str]]:
        args: list[bytes | memoryview | str | int] = [
            int(time.time() * 1000),
            int(self.config.dedupe_ttl_seconds * 1000),
            1 if self.config.priority_replay.enabled else 0,
        ]
        for e, payload in zip(experiences, payloads, strict=True):
            args += (e.id, e.model_version, payload)
        keys = [self.keys.stream, self.keys.seen, self.keys.stats, self.keys.priority]
        accepted, duplicates, entry_ids = self._put(keys=keys, args=args)
        return int(accepted), int(duplicates), [_text(x) for x in entry_ids]

    # ---- read ------------------------------------------------------------------------------------

    def read(self, consumer: str, batch_size: int, min_model_version: int = 0) -> ReadResult:
        """Reclaimed entries first, then new ones; never waits (a long poll waits with `wait_for_append`)."""
        if self.config.priority_replay.enabled:
            return self._read_replay(batch_size, min_model_version)
        return self._read_once(consumer, batch_size, min_model_version)

    async def wait_for_append(self, client: redis.asyncio.Redis, block_ms: int) -> bool:
        """Wait up to `block_ms` for an entry the group has not consumed; True when one is there.

        Asynchronous, so that a waiting read holds no thread; call it after a `read` that found nothing: an
        entry appended since is after the group's last-delivered id, and is found at once. A priority-replay
        stream is read by sampling, not through the group, and is never waited for.
        """
        if self.config.priority_replay.enabled:
            return False
        last_delivered = "0-0"
        for group in await client.xinfo_groups(self.keys.stream):
            if _text(group["name"]) == self.config.group:
                last_delivered = _text(group["last-delivered-id"])
        return bool(await client.xread({self.keys.stream: last_delivered}, count=1, block=block_ms))

    def _read_once(self, consumer: str, batch_size: int, min_model_version: int) -> ReadResult:
        """RECLAIM (ids only), XREADGROUP and the delivered counter, in one MULTI: one round trip.

        Payloads come straight from Redis, never through Lua. The XREADGROUP is sent before RECLAIM's
        answer is known, so it asks for a whole batch: when RECLAIM did claim entries, the fresh ones
        beyond the batch are handed back undelivered (delivery count 0, reclaimable at once). Redis counts
        every entry the MULTI delivered (see scripts.RECLAIM); a second round trip, only when needed,
        corrects that count (stale entries, entries handed back, entries trimmed since they were claimed)
        and acknowledges stale entries. Not one atomic step, and need not be: whatever a crash leaves
        between the steps is pending under this consumer and is reclaimed (and its staleness judged) later.
        """
        keys, config = self.keys, self.config
        reclaim = (
            "EVAL",
            scripts.RECLAIM,
            3,
            keys.stream,
            keys.dead_letters,
            keys.stats,
            config.group,
            consumer,
            config.claim_idle_ms,
            batch_size,
            config.max_deliveries,
        )
        delivered = ("EVAL", scripts.DELIVERED, 2, keys.stream, keys.stats, config.group, consumer)

        def attempt(session: resp.Session) -> ReadResult:
            (((claimed, dead), rows, pending),) = session.call(
                [resp.Multi((reclaim, _xreadgroup(config.group, consumer, keys.stream, batch_size), delivered))]
            )
            counted = len(claimed) + len(rows)  # what the MULTI counted as delivered
            result = ReadResult(dead_lettered=int(dead))
            stale: list[bytes] = []
            surplus: list[bytes] = []

            def take(entry_id: bytes, deliveries: int, fields: dict | list) -> None:
                values = resp.field_map(fields)
                if int(values.get(b"v", 0)) < min_model_version:
                    stale.append(entry_id)
                else:
                    result.entries.append(DeliveredEntry(_text(entry_id), deliveries, values[b"d"]))

            if claimed:
                ranges = session.call([("XRANGE", keys.stream, entry_id, entry_id) for entry_id, _ in claimed])
                for (entry_id, deliveries), found in zip(claimed, ranges, strict=True):
                    if found:  # an entry deleted since (trim) has nothing left to deliver
                        take(entry_id, int(deliveries), found[0][1])
                result.reclaimed = len(result.entries)
            asked = batch_size
            while True:
                for entry_id, fields in rows:
                    if len(result.entries) < batch_size:
                        take(entry_id, 1, fields)
                    else:
                        surplus.append(entry_id)
                if len(rows) < asked or len(result.entries) >= batch_size:
                    break
                asked = batch_size - len(result.entries)  # stale entries left room: fill it
                (rows,) = session.call([_xreadgroup(config.group, consumer, keys.stream, asked)])
                pending += len(rows)
            corrections: list[resp.Command] = []
            if stale:
                corrections.append(("XACK", keys.stream, config.group, *stale))
                corrections.append(("HINCRBY", keys.stats, "dropped:stale", len(stale)))
            if len(result.entries) != counted:
                corrections.append(("HINCRBY", keys.stats, "delivered", len(result.entries) - counted))
            if surplus:
                # JUSTID leaves the count alone, RETRYCOUNT 0 undoes this delivery; IDLE makes them reclaimable.
                idle = ("IDLE", config.claim_idle_ms, "RETRYCOUNT", 0, "JUSTID")
                corrections.append(("XCLAIM", keys.stream, config.group, consumer, 0, *surplus, *idle))
            if corrections:
                session.call(corrections)
            result.dropped_stale = len(stale)
            # What the consumer holds as far as the stream knows: stale entries were acknowledged, the surplus is
            # handed back (reclaimable at once, though still listed under this consumer).
            result.consumer_pending = int(pending) - len(stale) - len(surplus)
            return result

        return resp.run(self.client, attempt)

    def _read_replay(self, batch_size: int, min_model_version: int) -> ReadResult:
        replay = self.config.priority_replay
        rows, stale = self._replay(
            keys=[self.keys.stream, self.keys.priority, self.keys.uses, self.keys.stats],
            args=[batch_size, replay.decay, replay.use_limit, min_model_version],
        )
        entries = [DeliveredEntry(_text(eid), int(uses), resp.field_map(fields)[b"d"]) for eid, uses, fields in rows]
        return ReadResult(entries=entries, dropped_stale=int(stale))

    # ---- acknowledge -----------------------------------------------------------------------------

    def ack(self, entry_ids: Sequence[str]) -> int:
        if not entry_ids or self.config.priority_replay.enabled:
            return 0
        command: resp.Command = (
            "EVAL",
            scripts.ACK,
            2,
            self.keys.stream,
            self.keys.stats,
            self.config.group,
            *entry_ids,
        )
        (acked,) = resp.run(self.client, lambda session: session.call([command]))
        return int(acked)

    def nack(self, consumer: str, entry_ids: Sequence[str]) -> int:
        """Make entries reclaimable at once; the redelivery counts toward `max_deliveries`."""
        if not entry_ids or self.config.priority_replay.enabled:
            return 0
        # JUSTID leaves the delivery counter alone; the reclaim that redelivers increments it.
        claimed = self.client.xclaim(
            self.keys.stream,
            self.config.group,
            consumer,
            0,
            list(entry_ids),
            idle=self.config.claim_idle_ms + 1,
            justid=True,
        )
        return len(claimed)

    def renew(self, consumer: str, entry_ids: Sequence[str]) -> int:
        """Keep the entries `consumer` holds (delivered, not yet acknowledged) from being reclaimed for another
        `claim_idle_ms`; those it no longer holds are left alone. How many it still held."""
        if not entry_ids or self.config.priority_replay.enabled:
            return 0
        return int(self.client.eval(scripts.RENEW, 1, self.keys.stream, self.config.group, consumer, *entry_ids))

    def pending_of(self, consumer: str, page: int = 1000) -> list[str]:
        """Every entry id delivered to `consumer` and not yet acknowledged (its pending entries list)."""
        ids: list[str] = []
        start = "-"
        while True:
            rows = self.client.xpending_range(
                self.keys.stream, self.config.group, min=start, max="+", count=page, consumername=consumer
            )
            ids += [_text(cast(bytes, row["message_id"])) for row in rows]
            if len(rows) < page:
                return ids
            start = _next_id(ids[-1])

    # ---- maintenance and inspection ---------------------------------------------------------------

    def trim(self, keep: int | None = None) -> int:
        """Remove the oldest acknowledged entries down to `keep` (default max_len); never unacked ones."""
        keep = self.config.max_len if keep is None else keep
        length = self.client.xlen(self.keys.stream)
        excess = length - keep
        if excess <= 0 or self.config.priority_replay.enabled:
            return 0
        safe = self._oldest_unacknowledged()
        last_rows = cast(_Rows, self.client.xrange(self.keys.stream, "-", "+", count=excess))
        if not last_rows:
            return 0
        cutoff = _next_id(_text(last_rows[-1][0]))
        if safe is not None and _id_key(safe) < _id_key(cutoff):
            cutoff = safe
        return int(self.client.xtrim(self.keys.stream, minid=cutoff, approximate=False))

    def _oldest_unacknowledged(self) -> str | None:
        """The smallest entry id the group has not acknowledged: pending ones and undelivered ones."""
        candidates = []
        summary = self.client.xpending(self.keys.stream, self.config.group)
        if summary["pending"]:
            candidates.append(_text(summary["min"]))
        for group in self.client.xinfo_groups(self.keys.stream):
            if _text(group["name"]) == self.config.group:
                candidates.append(_next_id(_text(group["last-delivered-id"])))
        return min(candidates, key=_id_key) if candidates else None

    def stats(self) -> StreamStats:
        counters = {_text(k): int(v) for k, v in self.client.hgetall(self.keys.stats).items()}
        pending = lag = consumers = 0
        if self.client.exists(self.keys.stream):
            tail = self.client.xrevrange(self.keys.stream, count=1) or []
            newest = next((_text(i) for i, _ in tail if i), None)
            for group in self.client.xinfo_groups(self.keys.stream):
                if _text(group["name"]) == self.config.group:
                    pending = int(group["pending"])
                    consumers = int(group["consumers"])
                    # Redis's lag is entries added minus a count of entries read that a moved last-delivered id
                    # (a hand-back) or a reload can leave wrong (a soak ended with every entry acknowledged and a
                    # lag of 38,912); when the group has delivered the newest entry nothing waits, whatever it says.
                    delivered = _id_key(_text(group["last-delivered-id"]))
                    delivered_all = newest is None or delivered >= _id_key(newest)
                    lag = 0 if delivered_all else int(group.get("lag") or 0)
        return {
            "length": int(self.client.xlen(self.keys.stream)),
            "pending": pending,
            "lag": lag,
            "consumers": consumers,
            "dead_letters": int(self.client.xlen(self.keys.dead_letters)),
            "put": counters.get("put", 0),
            "delivered": counters.get("delivered", 0),
            "acked": counters.get("acked", 0),
            "dropped": {k.removeprefix("dropped:"): v for k, v in counters.items() if k.startswith("dropped:")},
        }

    def entries(self, batch: int = 512) -> Iterator[tuple[str, bytes]]:
        """Every entry still in the stream, oldest first: (entry id, serialized Experience)."""
        return self._scan(newest_first=False, batch=batch)

    def newest(self, batch: int = 256) -> Iterator[tuple[str, bytes]]:
        """Every entry still in the stream, newest first (XREVRANGE): a look that delivers nothing."""
        return self._scan(newest_first=True, batch=batch)

    def _scan(self, *, newest_first: bool, batch: int) -> Iterator[tuple[str, bytes]]:
        cursor = "+" if newest_first else "-"
        while True:
            if newest_first:
                rows = cast(_Rows, self.client.xrevrange(self.keys.stream, cursor, "-", count=batch))
            else:
                rows = cast(_Rows, self.client.xrange(self.keys.stream, cursor, "+", count=batch))
            for entry_id, fields in rows:
                yield _text(entry_id), resp.field_map(fields)[b"d"]
            if len(rows) < batch:
                return
            cursor = "(" + _text(rows[-1][0])  # exclusive: continue past the last entry seen

    def _count_drops(self, dropped: Counter[str]) -> None:
        if dropped:
            pipe = self.client.pipeline()
            for reason, n in dropped.items():
                pipe.hincrby(self.keys.stats, f"dropped:{reason}", n)
            pipe.execute()


_Rows = list[tuple[bytes, dict[bytes, bytes]]]  # XRANGE replies: (entry id, fields); replies are not decoded


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# XADD <stream> * id <experience id> v <model version> d <payload>, up to the payload itself.
_XADD = b"*9\r\n$4\r\nXADD\r\n%b$1\r\n*\r\n$2\r\nid\r\n$%d\r\n%b\r\n$1\r\nv\r\n$%d\r\n%b\r\n$1\r\nd\r\n$%d\r\n"


def _xadd(stream_key: bytes, experience_id: str, version: int, payload: bytes | memoryview) -> resp.Packed:
    """The XADD of one experience (`stream_key` in RESP form, see `resp.bulk`), packed in one format
    operation: a batch has many, and packing them argument by argument cost more than Redis runs them."""
    eid, ver = experience_id.encode(), b"%d" % version
    size = memoryview(payload).nbytes
    return resp.Packed((_XADD % (stream_key, len(eid), eid, len(ver), ver, size), payload, b"\r\n"))


def _xreadgroup(group: str, consumer: str, stream: str, count: int) -> resp.Rows:
    return resp.Rows(("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", stream, ">"))


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _next_id(entry_id: str) -> str:
    ms, seq = _id_key(entry_id)
    return f"{ms}-{seq + 1}"
