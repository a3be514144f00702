"""One task set: rows in memory, hand-out state in Redis (cursor, leases, pass rates).

A lease is keyed by the task's *position* in the hand-out order, so the same row handed out twice
(a later epoch, or the `random` selector) holds two independent leases.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from typing import cast

import redis
from google.protobuf import struct_pb2

from trinity.buffer.keys import TASKSETS, TaskSetKeys
from trinity.buffer.rows import Row
from trinity.buffer.tasksets.mapping import RowMapping, check_rows
from trinity.buffer.tasksets.selectors import SELECTORS, pick_by_difficulty
from trinity.config import TaskSetConfig
from trinity.runtime.errors import InvalidArgument
from trinity.v1 import buffer_pb2, common_pb2

# KEYS: leases, owners, cursor   ARGV: now_ms, deadline_ms, want, total, consumer
# Expired leases are renewed to the caller first; the rest come from fresh positions.
_LEASE = """
local now, deadline = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, total = tonumber(ARGV[3]), tonumber(ARGV[4])
local renewed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, want)
for _, member in ipairs(renewed) do
  redis.call('ZADD', KEYS[1], deadline, member)
  redis.call('HSET', KEYS[2], member, ARGV[5])
end
local start = tonumber(redis.call('GET', KEYS[3]) or '0')
local take = math.max(0, math.min(want - #renewed, total - start))
for position = start, start + take - 1 do
  redis.call('ZADD', KEYS[1], deadline, position)
  redis.call('HSET', KEYS[2], position, ARGV[5])
end
redis.call('SET', KEYS[3], start + take)
return {renewed, start, take}
"""

# KEYS: leases, owners   ARGV: deadline_ms, consumer, lease ids...
# A lease is renewed only while this consumer still owns it, expired or not: an expired lease nobody took
# is still this consumer's work; one handed to another consumer (or completed) is lost.
_RENEW = """
local renewed, lost = {}, {}
for i = 3, #ARGV do
  local member = ARGV[i]
  if redis.call('HGET', KEYS[2], member) == ARGV[2] and redis.call('ZSCORE', KEYS[1], member) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], member)
    table.insert(renewed, member)
  else
    table.insert(lost, member)
  end
end
return {renewed, lost}
"""

_PASS_RATE_SMOOTHING = 0.5  # weight of the newest report: the policy changes, old rates go stale


class TaskSet:
    """Hand-out state in Redis; the client does not decode replies (bytes), which the casts tell the type checker."""

    def __init__(self, client: redis.Redis, config: TaskSetConfig, rows: Sequence[Row]) -> None:
        if not rows:
            passing = " that pass its filters" if config.filters else ""
            raise InvalidArgument("path", f"task set {config.name!r} has no rows{passing}")
        self.client = client
        self.config = config
        self.rows = rows
        self.keys = TaskSetKeys(config.name)
        self._lease = client.register_script(_LEASE)
        self._renew = client.register_script(_RENEW)
        self._assign_key = self.keys.spec.removesuffix(":spec") + ":assign"
        self.mapping = RowMapping(config)
        check_rows(rows, self.mapping)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def total(self) -> int:
        return self.size * self.config.epochs

    # ---- lifecycle -------------------------------------------------------------------------------

    def save_spec(self, replace: bool) -> None:
        pipe = self.client.pipeline()
        if replace:
            pipe.delete(*self.keys.all(), self._assign_key)
            for key in self.client.scan_iter(match=self.keys.used(0).removesuffix("0") + "*"):
                pipe.delete(key)
        pipe.set(self.keys.spec, self.config.model_dump_json())
        pipe.sadd(TASKSETS, self.config.name)
        pipe.execute()

    # ---- hand-out --------------------------------------------------------------------------------

    def lease(self, consumer: str, batch_size: int, lease_seconds: float = 0) -> tuple[list[common_pb2.Task], bool]:
        now_ms = int(time.time() * 1000)
        deadline = now_ms + int((lease_seconds or self.config.lease_seconds) * 1000)
        renewed, start, take = self._lease(
            keys=[self.keys.leases, self.keys.owners, self.keys.cursor],
            args=[now_ms, deadline, batch_size, self.total, consumer],
        )
        positions = [int(m) for m in renewed] + list(range(int(start), int(start) + int(take)))
        indices = self._indices(positions)
        tasks = [self._task(pos, indices[pos], deadline) for pos in positions]
        return tasks, (not tasks and self.exhausted())

    def renew(
        self, consumer: str, lease_ids: Sequence[str], lease_seconds: float = 0
    ) -> tuple[list[str], list[str], int]:
        """Extend the leases `consumer` still holds to now + `lease_seconds`: (renewed, lost, new deadline ms)."""
        deadline = int(time.time() * 1000) + int((lease_seconds or self.config.lease_seconds) * 1000)
        renewed, lost = self._renew(keys=[self.keys.leases, self.keys.owners], args=[deadline, consumer, *lease_ids])
        return [m.decode() for m in renewed], [m.decode() for m in lost], deadline

    def _indices(self, positions: list[int]) -> dict[int, int]:
        if self.config.selector != "difficulty":
            select = SELECTORS.get(self.config.selector)
            return {p: select(p, self.size, self.config.seed) for p in positions}
        return self._difficulty_indices(positions)

    def _difficulty_indices(self, positions: list[int]) -> dict[int, int]:
        """Assign rows to positions by pass rate; assignments persist so a re-leased task keeps its row."""
        known = self.client.hmget(self._assign_key, positions) if positions else []
        result = {p: int(v) for p, v in zip(positions, known, strict=True) if v is not None}
        fresh = [p for p in positions if p not in result]
        if not fresh:
            return result
        with self.client.lock(self.keys.lock, timeout=30, blocking_timeout=30):
            rates = self.pass_rates()
            for epoch in sorted({p // self.size for p in fresh}):
                in_epoch = [p for p in fresh if p // self.size == epoch]
                used = {int(x) for x in self.client.smembers(self.keys.used(epoch))}
                candidates = [i for i in range(self.size) if i not in used]
                rng = random.Random(f"{self.config.seed}:{epoch}:{len(used)}")
                chosen = pick_by_difficulty(
                    candidates,
                    rates,
                    len(in_epoch),
                    target=self.config.target_pass_rate,
                    temperature=self.config.curriculum_temperature,
                    rng=rng,
                )
                pipe = self.client.pipeline()
                for position, index in zip(in_epoch, chosen, strict=True):
                    result[position] = index
                    pipe.hset(self._assign_key, position, index)
                    pipe.sadd(self.keys.used(epoch), index)
                pipe.execute()
        return result

    def _task(self, position: int, index: int, deadline_ms: int) -> common_pb2.Task:
        row = self.rows[index]
        fields = self.mapping.fields(row, index)
        task = common_pb2.Task(
            id=f"{self.config.name}/{index}",
            taskset=self.config.name,
            index=index,
            epoch=position // self.size,
            prompt=fields.prompt,
            answer=fields.answer,
            workflow=fields.workflow,
            reward_fn=fields.reward_fn,
            lease_deadline_ms=deadline_ms,
            lease_id=str(position),
            pass_rate=self.pass_rates([index]).get(index, -1.0),
        )
        for role, content in fields.messages:
            task.messages.add(role=role, content=content)
        payload = struct_pb2.Struct()
        payload.update(json.loads(json.dumps(row, default=str)))
        task.payload.CopyFrom(payload)
        return task

    # ---- completion and release --------------------------------------------------------------------

    def complete(self, results: Sequence[buffer_pb2.TaskResult]) -> tuple[int, int]:
        """End leases; record pass rates (even for a lease that expired meanwhile: the score is real).

        A failed result ends its lease like any other, so the task is not handed out again, and records no
        pass rate: a task nobody could roll out neither passed nor failed the policy.
        """
        pipe = self.client.pipeline()
        for r in results:
            pipe.zrem(self.keys.leases, r.lease_id)
            pipe.hdel(self.keys.owners, r.lease_id)
        removed = [int(x) for x in pipe.execute()[0::2]]
        completed = sum(removed)
        failed = sum(x for x, r in zip(removed, results, strict=True) if r.failed)
        if completed:
            self.client.incrby(self.keys.completed, completed)
        if failed:
            self.client.incrby(self.keys.failed, failed)
        scored = {}
        for r in results:
            if r.pass_rate >= 0 and not r.failed:
                index = _index_of(r.task_id, self.config.name)
                if index is not None:
                    scored[index] = (r.pass_rate, max(r.samples, 1))
        if scored:
            self.record_pass_rates(scored)
        return completed, len(results) - completed

    def release(self, consumer: str) -> int:
        """Expire every lease `consumer` holds, so the next LeaseTasks hands those tasks out again."""
        owners = cast("dict[bytes, bytes]", self.client.hgetall(self.keys.owners))
        held = [m for m, owner in owners.items() if owner.decode() == consumer]
        if not held:
            return 0
        self.client.zadd(self.keys.leases, {m: 0 for m in held}, xx=True)
        return len(held)

    # ---- curriculum ---------------------------------------------------------------------------------

    def record_pass_rates(self, scored: dict[int, tuple[float, int]]) -> None:
        previous = self.pass_rates(list(scored))
        pipe = self.client.pipeline()
        for index, (rate, samples) in scored.items():
            old = previous.get(index)
            new = rate if old is None else _PASS_RATE_SMOOTHING * rate + (1 - _PASS_RATE_SMOOTHING) * old
            pipe.hset(self.keys.pass_rates, index, repr(new))
            pipe.hincrby(self.keys.pass_rates, f"n:{index}", samples)
        pipe.execute()

    def pass_rates(self, indices: list[int] | None = None) -> dict[int, float]:
        if indices is not None:
            values = self.client.hmget(self.keys.pass_rates, indices) if indices else []
            return {i: float(v) for i, v in zip(indices, values, strict=True) if v is not None}
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.keys.pass_rates))
        return {int(k): float(v) for k, v in raw.items() if not k.startswith(b"n:")}

    # ---- inspection ---------------------------------------------------------------------------------

    def exhausted(self) -> bool:
        cursor = int(self.client.get(self.keys.cursor) or 0)
        return cursor >= self.total and self.client.zcard(self.keys.leases) == 0

    def can_hand_out(self) -> bool:
        """Whether a lease now would get a task: a position not yet handed out, or a lease that expired."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.cursor)
        pipe.zcount(self.keys.leases, "-inf", int(time.time() * 1000))
        cursor, expired = pipe.execute()
        return int(cursor or 0) < self.total or int(expired) > 0

    def info(self) -> buffer_pb2.TaskSetInfo:
        cursor = int(self.client.get(self.keys.cursor) or 0)
        leased = int(self.client.zcard(self.keys.leases))
        return buffer_pb2.TaskSetInfo(
            size=self.size,
            total_tasks=self.total,
            handed_out=cursor,
            completed=int(self.client.get(self.keys.completed) or 0),
            failed=int(self.client.get(self.keys.failed) or 0),
            leased=leased,
            epoch=min(cursor // self.size, self.config.epochs - 1) if self.size else 0,
            exhausted=cursor >= self.total and leased == 0,
        )


def _index_of(task_id: str, taskset: str) -> int | None:
    prefix, _, index = task_id.rpartition("/")
    if prefix != taskset or not index.isdigit():
        return None
    return int(index)
