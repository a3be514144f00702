"""Runs and their event logs in Redis: a run is a protobuf blob, its events a Redis Stream."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import cast

import redis

from trinity.gateway import keys
from trinity.gateway.metrics import EVENTS
from trinity.runtime.errors import NotFound
from trinity.v1 import gateway_pb2

TERMINAL = {gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED}


def now_ms() -> int:
    return int(time.time() * 1000)


class RunStore:
    """The client does not decode replies (they are bytes); the casts below say so to the type checker."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def create(self, name: str, config_json: str, run_id: str = "") -> gateway_pb2.Run:
        run_id = run_id or f"{name}-{uuid.uuid4().hex[:8]}"
        created = now_ms()
        run = gateway_pb2.Run(
            id=run_id,
            name=name,
            state=gateway_pb2.RUN_STATE_PENDING,
            config_json=config_json,
            created_unix_ms=created,
            updated_unix_ms=created,
            model_version=0,
        )
        if not self.client.set(keys.run(run_id), run.SerializeToString(), nx=True):
            from trinity.runtime.errors import AlreadyExists

            raise AlreadyExists(f"run {run_id!r} already exists")
        self.client.zadd(keys.RUNS, {run_id: created})
        return run

    def get(self, run_id: str) -> gateway_pb2.Run:
        raw = cast("bytes | None", self.client.get(keys.run(run_id)))
        if raw is None:
            raise NotFound(f"run {run_id!r} does not exist")
        return gateway_pb2.Run.FromString(raw)

    def save(self, run: gateway_pb2.Run) -> None:
        run.updated_unix_ms = now_ms()
        self.client.set(keys.run(run.id), run.SerializeToString())

    def all(self) -> list[gateway_pb2.Run]:
        ids = [i.decode() for i in cast("list[bytes]", self.client.zrange(keys.RUNS, 0, -1))]
        raws = cast("list[bytes | None]", self.client.mget([keys.run(i) for i in ids])) if ids else []
        return [gateway_pb2.Run.FromString(r) for r in raws if r is not None]

    def append_event(self, event: gateway_pb2.RunEvent) -> str:
        event.unix_ms = event.unix_ms or now_ms()
        seq = cast(bytes, self.client.xadd(keys.events(event.run_id), {"e": event.SerializeToString()}))
        EVENTS.labels(event.kind or "unknown").inc()
        return seq.decode()

    def events(self, run_id: str, after: str = "0", block_ms: int = 1000) -> Iterator[gateway_pb2.RunEvent]:
        """Events after `after`; waits up to block_ms for new ones; returns when none arrive."""
        # BLOCK 0 would wait forever in Redis: a zero wait is a plain, non-blocking read.
        reply = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None",
            self.client.xread({keys.events(run_id): after or "0"}, count=500, block=block_ms or None),
        )
        for _stream, rows in reply or []:
            for seq, fields in rows:
                event = gateway_pb2.RunEvent.FromString(fields[b"e"])
                event.seq = seq.decode()
                yield event
