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

import redis

from trinity.buffer.keys import STREAMS, StreamKeys
from trinity.buffer.operators import OperatorContext, apply_operators
from trinity.buffer.streams import scripts
from trinity.config import StreamConfig
from trinity.v1 import common_pb2


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
        self._read = client.register_script(scripts.READ)
        self._ack = client.register_script(scripts.ACK)
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
        payloads: Sequence[bytes] | None = None,
    ) -> PutResult:
        """Operators, then dedupe by experience id, then append; one round trip for the whole batch.

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
            payloads = [e.SerializeToString() for e in kept]
        now_ms = int(time.time() * 1000)
        args: list[bytes | str | int] = [
            now_ms,
            int(self.config.dedupe_ttl_seconds * 1000),
            1 if self.config.priority_replay.enabled else 0,
        ]
        for e, payload in zip(kept, payloads, strict=True):
            args += (e.id, e.model_version, payload)
        keys = [self.keys.stream, self.keys.seen, self.keys.stats, self.keys.priority]
        accepted, duplicates, entry_ids = self._put(keys=keys, args=args)
        result.accepted = int(accepted)
        result.entry_ids = [_text(x) for x in entry_ids]
        if duplicates:
            result.dropped["duplicate"] += int(duplicates)
        if self.config.max_len and self.client.xlen(self.keys.stream) > self.config.max_len * 1.1:
            self.trim()
        return result

    # ---- read ------------------------------------------------------------------------------------

    def read(self, consumer: str, batch_size: int, block_ms: int = 0, min_model_version: int = 0) -> ReadResult:
        """Reclaimed entries first, then new ones; if none and `block_ms` > 0, wait for an append."""
        if self.config.priority_replay.enabled:
            return self._read_replay(batch_size, min_model_version)
        result, last_id = self._read_once(consumer, batch_size, min_model_version)
        # Scripts cannot block: wait here for anything appended after what the script saw.
        if (
            not result.entries
            and block_ms > 0
            and self.client.xread({self.keys.stream: last_id}, count=1, block=block_ms)
        ):
            again, _ = self._read_once(consumer, batch_size, min_model_version)
            again.dropped_stale += result.dropped_stale
            again.dead_lettered += result.dead_lettered
            return again
        return result

    def _read_once(self, consumer: str, batch_size: int, min_model_version: int) -> tuple[ReadResult, bytes]:
        rows, stale, reclaimed, dead, last_id = self._read(
            keys=[self.keys.stream, self.keys.dead_letters, self.keys.stats],
            args=[
                self.config.group,
                consumer,
                self.config.claim_idle_ms,
                batch_size,
                self.config.max_deliveries,
                min_model_version,
            ],
        )
        result = ReadResult(
            entries=[DeliveredEntry(_text(eid), int(n), payload) for eid, n, payload in rows],
            dropped_stale=int(stale),
            reclaimed=int(reclaimed),
            dead_lettered=int(dead),
        )
        return result, last_id

    def _read_replay(self, batch_size: int, min_model_version: int) -> ReadResult:
        replay = self.config.priority_replay
        rows, stale = self._replay(
            keys=[self.keys.stream, self.keys.priority, self.keys.uses, self.keys.stats],
            args=[batch_size, replay.decay, replay.use_limit, min_model_version],
        )
        entries = [DeliveredEntry(_text(eid), int(uses), _fields(fields)[b"d"]) for eid, uses, fields in rows]
        return ReadResult(entries=entries, dropped_stale=int(stale))

    # ---- acknowledge -----------------------------------------------------------------------------

    def ack(self, entry_ids: Sequence[str]) -> int:
        if not entry_ids or self.config.priority_replay.enabled:
            return 0
        return int(self._ack(keys=[self.keys.stream, self.keys.stats], args=[self.config.group, *entry_ids]))

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

    # ---- maintenance and inspection ---------------------------------------------------------------

    def trim(self, keep: int | None = None) -> int:
        """Remove the oldest acknowledged entries down to `keep` (default max_len); never unacked ones."""
        keep = self.config.max_len if keep is None else keep
        length = self.client.xlen(self.keys.stream)
        excess = length - keep
        if excess <= 0 or self.config.priority_replay.enabled:
            return 0
        safe = self._oldest_unacknowledged()
        last_rows = self.client.xrange(self.keys.stream, "-", "+", count=excess)
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

    def stats(self) -> dict[str, object]:
        counters = {_text(k): int(v) for k, v in self.client.hgetall(self.keys.stats).items()}
        pending = lag = consumers = 0
        if self.client.exists(self.keys.stream):
            for group in self.client.xinfo_groups(self.keys.stream):
                if _text(group["name"]) == self.config.group:
                    pending = int(group["pending"])
                    lag = int(group.get("lag") or 0)
                    consumers = int(group["consumers"])
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
        start = "-"
        while True:
            rows = self.client.xrange(self.keys.stream, start, "+", count=batch)
            for entry_id, fields in rows:
                yield _text(entry_id), _fields(fields)[b"d"]
            if len(rows) < batch:
                return
            start = "(" + _text(rows[-1][0])

    def _count_drops(self, dropped: Counter[str]) -> None:
        if dropped:
            pipe = self.client.pipeline()
            for reason, n in dropped.items():
                pipe.hincrby(self.keys.stats, f"dropped:{reason}", n)
            pipe.execute()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _fields(fields: dict | list) -> dict[bytes, bytes]:
    """Stream fields as a dict; Lua replies give them as a flat [k, v, k, v] list."""
    if isinstance(fields, dict):
        return fields
    return {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _next_id(entry_id: str) -> str:
    ms, seq = _id_key(entry_id)
    return f"{ms}-{seq + 1}"
