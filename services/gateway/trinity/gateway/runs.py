"""Runs and their event logs in Redis: a run is a protobuf blob, its events a Redis Stream."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import cast

import redis
import redis.asyncio

from trinity.gateway import keys
from trinity.gateway.metrics import EVENTS
from trinity.runtime.errors import AlreadyExists, NotFound, Unavailable
from trinity.runtime.events import decode_event, kind_name
from trinity.v1 import gateway_pb2

EVENT_ID_TTL_S = 24 * 3600  # far longer than any client retries a report
# KEYS: the run's event stream, the event id's key, the run's timeline; ARGV: the event, the id's TTL, the spans the
# timeline keeps, then (step, span) pairs to add to it -> {seq, 1 if recorded now}. One call: under `appendfsync
# always` each write call waits for its own fsync.
_APPEND_ONCE = """
local seq = redis.call('GET', KEYS[2])
if seq then return {seq, 0} end
seq = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
redis.call('SET', KEYS[2], seq, 'EX', ARGV[2])
if #ARGV > 3 then
  for i = 4, #ARGV, 2 do redis.call('ZADD', KEYS[3], ARGV[i], ARGV[i + 1]) end
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[3]) - 1)
end
return {seq, 1}
"""

TERMINAL = {gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED}
# A run's watchers wait this long for the next event before the run's state is looked at, and the short one once
# an event said the run is over: they end after that much quiet.
WATCH_IDLE_MS, WATCH_TAIL_MS = 5_000, 500
FEED_EVENTS = 1000  # the newest events of a watched run kept in memory for its watchers
# Spans of a run's timeline kept in Redis: the newest by step (a step of one trainer and two explorers reports about
# 25, so about the last 800 steps; older ones are dropped as new ones come).
TIMELINE_SPANS = 20_000
# A CreateRun's request id names its run this long: far past any retry of it.
CREATE_REQUEST_SECONDS = 24 * 3600
# A repeated CreateRun waits this long for the first one to write the run it named (a few Redis round trips).
CREATE_REQUEST_WAIT_S = 10.0


@dataclass(frozen=True)
class Queued:
    """Who queues a new run, at what priority, and what must hold for it to be created (a tenant's runs quota,
    checked against every run)."""

    tenant: str = ""
    priority: int = 0
    admit: Callable[[list[gateway_pb2.Run]], None] = lambda _runs: None


def now_ms() -> int:
    return int(time.time() * 1000)


def _decode_run(run_id: str, raw: bytes | None) -> gateway_pb2.Run:
    if raw is None:
        raise NotFound(f"run {run_id!r} does not exist")
    return gateway_pb2.Run.FromString(raw)


def _later(seq: str, than: str) -> bool:
    """Whether stream entry id `seq` comes after `than` ("0" is before every entry)."""

    def key(entry_id: str) -> tuple[int, int]:
        ms, _, n = entry_id.partition("-")
        return int(ms or 0), int(n or 0)

    return key(seq) > key(than)


class _Feed:
    """A run's events as they arrive, read once for every watcher of the run in this process.

    `recent` holds the newest FEED_EVENTS events; `start` is the id just before the oldest of them, so a watcher
    at or after `start` finds every newer event here, and one further behind reads Redis itself.
    """

    def __init__(self, start: str) -> None:
        self.start = start
        self.recent: deque[gateway_pb2.RunEvent] = deque()
        self.over = False
        self.error: Exception | None = None
        self.changed = asyncio.Condition()
        self.watchers = 0
        self.reader: asyncio.Task[None]

    @property
    def last(self) -> str:
        return self.recent[-1].seq if self.recent else self.start

    async def publish(self, events: list[gateway_pb2.RunEvent], *, over: bool = False) -> None:
        self.recent.extend(events)
        while len(self.recent) > FEED_EVENTS:
            self.start = self.recent.popleft().seq
        self.over = over
        async with self.changed:
            self.changed.notify_all()

    async def fail(self, error: Exception) -> None:
        self.error = error
        async with self.changed:
            self.changed.notify_all()

    async def wait_past(self, position: str) -> None:
        """Until there is an event after `position`, or the run is over, or reading it failed."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.over or self.error is not None or _later(self.last, position))


class RunStore:
    """The client does not decode replies (they are bytes); the casts below say so to the type checker."""

    def __init__(self, client: redis.Redis, waits: redis.asyncio.Redis, timeline_spans: int = TIMELINE_SPANS) -> None:
        self.client = client
        self.waits = waits  # for watchers, on the server's loop
        self.timeline_spans = timeline_spans
        self._feeds: dict[str, _Feed] = {}  # run id -> the feed its watchers share (touched on the loop only)
        self._append_once = client.register_script(_APPEND_ONCE)
        self._creating = threading.Lock()

    def create(self, name: str, config_json: str, run_id: str = "") -> gateway_pb2.Run:
        return self.create_once(name, config_json, run_id)[0]

    def create_once(
        self,
        name: str,
        config_json: str,
        run_id: str = "",
        request_id: str = "",
        *,
        queue: Queued = Queued(),
    ) -> tuple[gateway_pb2.Run, bool]:
        """The new run, and True; or, for a `request_id` seen before (a retried CreateRun), the run that request
        created, and False. A new run is `queue.admit`ted first (a retry is not: its run counts already)."""
        run_id = run_id or f"{name}-{uuid.uuid4().hex[:8]}"
        if not request_id:
            return self._create(name, config_json, run_id, queue), True
        # The first attempt of the request claims it, under a mark of its own: a retried SET of this attempt (a
        # reply lost on the way back from Redis) finds its own mark, another attempt finds the first's.
        attempt, claim = uuid.uuid4().hex, keys.create_request(request_id)
        self.client.set(claim, f"{attempt} {run_id}", nx=True, ex=CREATE_REQUEST_SECONDS)
        first, _, first_run = cast("bytes", self.client.get(claim)).decode().partition(" ")
        if first != attempt:
            return self._created_by_another(claim, first_run), False
        try:
            return self._create(name, config_json, run_id, queue), True
        except BaseException:
            self.client.delete(claim)  # nothing created: a retry of the request starts afresh
            raise

    def _create(self, name: str, config_json: str, run_id: str, queue: Queued) -> gateway_pb2.Run:
        run = gateway_pb2.Run(id=run_id, name=name, state=gateway_pb2.RUN_STATE_PENDING, config_json=config_json)
        run.tenant, run.priority = queue.tenant, queue.priority
        # Under a lock: two CreateRuns of one tenant at its runs quota must not both find room.
        with self._creating:
            queue.admit(self.all())
            created = now_ms()
            run.created_unix_ms = run.updated_unix_ms = run.queued_unix_ms = created
            raw = run.SerializeToString()
            # A SET that Redis applied but whose reply was lost is sent again by the client (connect_redis) and then
            # finds its own value: that is this run, not another of the same id.
            if not self.client.set(keys.run(run_id), raw, nx=True) and self.client.get(keys.run(run_id)) != raw:
                raise AlreadyExists(f"run {run_id!r} already exists")
            self.client.zadd(keys.RUNS, {run_id: created})
        return run

    def _created_by_another(self, claim: str, run_id: str) -> gateway_pb2.Run:
        """The run that the first attempt of a request is writing, or has written. One that never appears (its
        gateway died between the claim and the run) frees the request for the caller's next retry."""
        deadline = time.monotonic() + CREATE_REQUEST_WAIT_S
        while True:
            try:
                return self.get(run_id)
            except NotFound:
                if time.monotonic() > deadline:
                    self.client.delete(claim)
                    raise Unavailable(
                        f"the first attempt of this CreateRun did not write run {run_id!r}; retry"
                    ) from None
                time.sleep(0.05)

    def get(self, run_id: str) -> gateway_pb2.Run:
        return _decode_run(run_id, cast("bytes | None", self.client.get(keys.run(run_id))))

    def save(self, run: gateway_pb2.Run) -> None:
        run.updated_unix_ms = now_ms()
        self.client.set(keys.run(run.id), run.SerializeToString())

    def all(self) -> list[gateway_pb2.Run]:
        ids = [i.decode() for i in cast("list[bytes]", self.client.zrange(keys.RUNS, 0, -1))]
        raws = cast("list[bytes | None]", self.client.mget([keys.run(i) for i in ids])) if ids else []
        return [gateway_pb2.Run.FromString(r) for r in raws if r is not None]

    def append_once(self, event: gateway_pb2.RunEvent, timeline: Sequence[gateway_pb2.Span] = ()) -> tuple[str, bool]:
        """Record a reported event, and add `timeline` (the spans it carried) to the run's, unless its `event_id`
        was recorded already (the reporter retried after a lost reply); returns its seq and whether it is new."""
        if not event.event_id:
            seq = self.append_event(event)
            self.add_spans(event.run_id, list(timeline))
            return seq, True
        event.unix_ms = event.unix_ms or now_ms()
        spans = [x for span in timeline for x in (span.step, span.SerializeToString(deterministic=True))]
        # One script, so that a gateway dying between the append and the id's record cannot record it twice.
        seq, new = cast(
            "list",
            self._append_once(
                keys=[keys.events(event.run_id), keys.event_id(event.run_id, event.event_id), keys.spans(event.run_id)],
                args=[event.SerializeToString(), EVENT_ID_TTL_S, self.timeline_spans, *spans],
            ),
        )
        if new:
            EVENTS.labels(kind_name(event.kind)).inc()
        return seq.decode(), bool(new)

    def append_event(self, event: gateway_pb2.RunEvent) -> str:
        event.unix_ms = event.unix_ms or now_ms()
        seq = cast(bytes, self.client.xadd(keys.events(event.run_id), {"e": event.SerializeToString()}))
        EVENTS.labels(kind_name(event.kind)).inc()
        return seq.decode()

    def add_spans(self, run_id: str, spans: list[gateway_pb2.Span]) -> None:
        """Add finished spans to the run's timeline, keeping the newest `timeline_spans` by step. A span added twice
        (a retried report) is kept once: the timeline is a set of the spans' bytes."""
        if not spans:
            return
        key = keys.spans(run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(key, {span.SerializeToString(deterministic=True): span.step for span in spans})
        pipe.zremrangebyrank(key, 0, -self.timeline_spans - 1)
        pipe.execute()

    def spans(self, run_id: str, since_step: int = 0) -> list[gateway_pb2.Span]:
        """The run's timeline from step `since_step` on, in order of start (NotFound for an unknown run)."""
        self.get(run_id)
        raws = cast("list[bytes]", self.client.zrangebyscore(keys.spans(run_id), since_step, "+inf"))
        spans = [gateway_pb2.Span.FromString(raw) for raw in raws]
        return sorted(spans, key=lambda s: (s.start_unix_ms, s.end_unix_ms, s.source))

    async def watch(self, run_id: str, after: str = "0") -> AsyncIterator[gateway_pb2.RunEvent]:
        """Every event after `after`, as they come, until the run is over (NotFound for an unknown run).

        On the server's loop, holding no thread however long the run. Watchers of one run share one reader
        (`_Feed`): a new event costs Redis one read, however many watch.
        """
        ended = await self._state(run_id) in TERMINAL
        newest = await self._newest(run_id)
        feed = self._feeds.get(run_id)
        if feed is None:  # (no await since the look-up: no second feed for the run)
            feed = self._feeds[run_id] = _Feed(start=newest)
            feed.reader = asyncio.create_task(self._follow(run_id, feed, ended=ended))
        feed.watchers += 1
        try:
            while True:
                await feed.wait_past(after)
                if feed.error is not None:
                    raise feed.error
                if _later(feed.start, after):  # behind what the feed holds (history): catch up from Redis
                    events = await self._events(run_id, after, block_ms=0)
                else:
                    events = [event for event in feed.recent if _later(event.seq, after)]
                if not events:  # only once the feed is over and this watcher has had every event
                    return
                for event in events:
                    after = event.seq
                    yield event
        finally:
            feed.watchers -= 1
            if feed.watchers == 0:
                self._drop(run_id, feed)
                feed.reader.cancel()

    async def _follow(self, run_id: str, feed: _Feed, *, ended: bool = False) -> None:
        """Read the run's events into `feed` until the run is over, or Redis fails. A run `ended` already when the
        feed starts (its history watched) is looked at again after the short wait, not the idle one."""
        try:
            hinted = ended  # an event said the run is over: wait briefly for stragglers, then look
            while not feed.over:
                events = await self._events(run_id, feed.last, block_ms=WATCH_TAIL_MS if hinted else WATCH_IDLE_MS)
                hinted = hinted or any(event.state in TERMINAL for event in events)
                if events:
                    await feed.publish(events)
                elif await self._state(run_id) in TERMINAL:
                    # Nothing new and the run is over: one last look closes the race with the final event.
                    await feed.publish(await self._events(run_id, feed.last, block_ms=0), over=True)
        except Exception as err:  # noqa: BLE001 - Redis down, most likely; the watchers must hear of it whatever
            await feed.fail(err)
        finally:
            self._drop(run_id, feed)  # a later watcher starts a feed of its own

    def _drop(self, run_id: str, feed: _Feed) -> None:
        if self._feeds.get(run_id) is feed:
            del self._feeds[run_id]

    async def _newest(self, run_id: str) -> str:
        """The id of the run's newest event, "0" before the first."""
        rows = cast("list[tuple[bytes, dict]]", await self.waits.xrevrange(keys.events(run_id), count=1))
        return rows[0][0].decode() if rows else "0"

    async def _state(self, run_id: str) -> gateway_pb2.RunState:
        return _decode_run(run_id, cast("bytes | None", await self.waits.get(keys.run(run_id)))).state

    async def _events(self, run_id: str, after: str, block_ms: int) -> list[gateway_pb2.RunEvent]:
        """Events after `after`; waits up to block_ms for the first one."""
        # BLOCK 0 would wait forever in Redis: a zero wait is a plain, non-blocking read.
        reply = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None",
            await self.waits.xread({keys.events(run_id): after or "0"}, count=500, block=block_ms or None),
        )
        events = []
        for _stream, rows in reply or []:
            for seq, fields in rows:
                event = decode_event(fields[b"e"])
                event.seq = seq.decode()
                events.append(event)
        return events
