"""Weight-sync group negotiation: membership, ranks, rendezvous, backend and generation.

The trainer opens a generation (it has already reserved the rendezvous port by starting the TCPStore
master); explorer workers join and get ranks 1..N; the group is ready when all N joined. Any change of
membership (a member died, an update failed) closes the generation; the next open starts a new one.
"""

from __future__ import annotations

from typing import cast, get_args

import redis

from trinity.config.sync import SyncMethod
from trinity.gateway import keys
from trinity.gateway.metrics import SYNC_GROUPS_FORMED
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, bounded, in_range
from trinity.runtime.limits import MAX_BUCKET_MB, MAX_PATH_CHARS, MAX_SYNC_TIMEOUT_SECONDS, MAX_SYNC_WORKERS
from trinity.v1 import gateway_pb2

METHODS: tuple[str, ...] = get_args(SyncMethod)


def choose_backend(requested: str, members_have_gpu: list[bool]) -> str:
    """`auto` means NCCL only when every member has a GPU, gloo otherwise."""
    if requested == "auto":
        return "nccl" if members_have_gpu and all(members_have_gpu) else "gloo"
    if requested == "nccl" and not all(members_have_gpu):
        raise InvalidArgument("synchronizer.method", "nccl needs a GPU on every member; use auto, gloo or checkpoint")
    return requested


class SyncGroups:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def _raw(self, key: str) -> bytes | None:
        # The gateway's Redis client does not decode replies: they are bytes.
        return cast("bytes | None", self.client.get(key))

    def get(self, run_id: str) -> gateway_pb2.SyncGroup:
        raw = self._raw(keys.sync_group(run_id))
        if raw is None:
            raise NotFound(f"run {run_id!r} has no sync group yet; the trainer opens it")
        return gateway_pb2.SyncGroup.FromString(raw)

    def _save(self, group: gateway_pb2.SyncGroup) -> None:
        self.client.set(keys.sync_group(group.run_id), group.SerializeToString())

    def open(self, request: gateway_pb2.OpenSyncGroupRequest) -> gateway_pb2.SyncGroup:
        # world_size = explorer_workers + 1 is an int32 too: 2**31 - 1 workers would overflow it.
        if not 1 <= request.explorer_workers <= MAX_SYNC_WORKERS:
            raise InvalidArgument("explorer_workers", f"must be between 1 and {MAX_SYNC_WORKERS}")
        if request.backend not in METHODS:
            raise InvalidArgument("backend", f"must be one of {', '.join(METHODS)} (synchronizer.method)")
        bounded(request.host, "host")
        bounded(request.checkpoint_dir, "checkpoint_dir", MAX_PATH_CHARS)
        if request.backend != "checkpoint" and not (request.host and 0 < request.port <= 65535):
            raise InvalidArgument("port", "the trainer must reserve a rendezvous host and port (1-65535) first")
        # The trainer sends its synchronizer section; the defaults live there, not here.
        for field, most in (("timeout_seconds", MAX_SYNC_TIMEOUT_SECONDS), ("bucket_mb", MAX_BUCKET_MB)):
            value = getattr(request, field)
            if not value > 0:  # NaN too
                raise InvalidArgument(field, f"must be > 0 (synchronizer.{field})")
            in_range(value, f"{field} (synchronizer.{field})", 0, most)
        with self.client.lock(keys.lock(request.run_id), timeout=10, blocking_timeout=10):
            raw = self._raw(keys.sync_group(request.run_id))
            generation = gateway_pb2.SyncGroup.FromString(raw).generation + 1 if raw else 1
            group = gateway_pb2.SyncGroup(
                run_id=request.run_id,
                generation=generation,
                backend=request.backend,
                host=request.host,
                port=request.port,
                world_size=request.explorer_workers + 1,
                members=[gateway_pb2.SyncMember(instance_id=request.instance_id, rank=0, has_gpu=request.has_gpu)],
                announced_version=-1,
                checkpoint_dir=request.checkpoint_dir,
                timeout_seconds=request.timeout_seconds,
                bucket_mb=request.bucket_mb,
            )
            self._save(group)
            return group

    def join(self, run_id: str, instance_id: str, has_gpu: bool) -> gateway_pb2.SyncGroup:
        with self.client.lock(keys.lock(run_id), timeout=10, blocking_timeout=10):
            group = self.get(run_id)
            mine = [m for m in group.members if m.instance_id == instance_id]
            if mine:
                group.rank = mine[0].rank
                return group
            if len(group.members) >= group.world_size:
                raise FailedPrecondition(
                    f"sync group of run {run_id!r} (generation {group.generation}) is full; "
                    "it is re-formed when a member leaves"
                )
            rank = len(group.members)
            group.members.add(instance_id=instance_id, rank=rank, has_gpu=has_gpu)
            if len(group.members) == group.world_size:
                group.backend = choose_backend(group.backend, [m.has_gpu for m in group.members])
                group.ready = True
                SYNC_GROUPS_FORMED.inc()
            self._save(group)
            group.rank = rank
            return group

    def announce(self, run_id: str, generation: int, version: int) -> gateway_pb2.SyncGroup:
        with self.client.lock(keys.lock(run_id), timeout=10, blocking_timeout=10):
            group = self.get(run_id)
            if generation != group.generation:
                raise FailedPrecondition(f"generation {generation} is over; the current one is {group.generation}")
            if version <= group.announced_version:
                raise FailedPrecondition(
                    f"weight versions only increase: {version} <= announced {group.announced_version}"
                )
            group.announced_version = version
            self._save(group)
            return group

    def close(self, run_id: str, generation: int) -> gateway_pb2.SyncGroup | None:
        """End a generation (member lost or update failed): not ready until the trainer opens a new one."""
        with self.client.lock(keys.lock(run_id), timeout=10, blocking_timeout=10):
            raw = self._raw(keys.sync_group(run_id))
            if raw is None:
                return None
            group = gateway_pb2.SyncGroup.FromString(raw)
            if generation and generation != group.generation:
                return group  # that generation is already over
            group.ready = False
            group.world_size = 0  # nobody can join a closed generation
            self._save(group)
            return group

    def members_of(self, instance_id: str) -> list[gateway_pb2.SyncGroup]:
        groups = []
        for key in self.client.scan_iter(match=keys.sync_group("*").replace("{*}", "*")):
            group = gateway_pb2.SyncGroup.FromString(cast(bytes, self._raw(key)))  # groups are never deleted
            if any(m.instance_id == instance_id for m in group.members) and group.ready:
                groups.append(group)
        return groups
