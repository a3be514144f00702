"""Weight-sync group negotiation: membership, ranks, rendezvous, backend and generation.

The trainer opens a generation (it has already reserved the rendezvous port by starting the TCPStore
master); explorers join and get ranks 1..N (one per engine worker: an explorer whose engine runs tensor/pipeline
parallel takes one rank per worker); the group is ready when all its explorers joined. Any change of
membership (a member died, an update failed) closes the generation; the next open starts a new one.

A gateway with a token also makes the secrets of a run's process groups: one per weight-sync generation (in the
`SyncGroup` it hands its callers) and one per run for the trainer's ranks (`rank_secret`). Whoever holds one may
join that group; the stores they meet in have no authentication of their own (docs/security.md, "Process groups").
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import cast, get_args

import redis

from trinity.config.sync import SyncMethod
from trinity.gateway import keys
from trinity.gateway.metrics import SYNC_GROUPS_FORMED
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, bounded, in_range
from trinity.runtime.limits import MAX_BUCKET_MB, MAX_PATH_CHARS, MAX_SYNC_TIMEOUT_SECONDS, MAX_SYNC_WORKERS
from trinity.v1 import gateway_pb2

METHODS: tuple[str, ...] = get_args(SyncMethod)


MAX_MEMBER_GPUS = 64
MAX_MEMBER_RANKS = 64  # engine workers (tensor x pipeline parallel) of one explorer
SECRET_BYTES = 32


def _one_gpu_shared_by_all(members: Sequence[gateway_pb2.SyncMember]) -> bool:
    trainer = members[0]
    return len(trainer.gpu_uuids) == 1 and all(
        m.host_id and m.host_id == trainer.host_id and list(m.gpu_uuids) == list(trainer.gpu_uuids) for m in members
    )


def _no_gpu_shared(members: Sequence[gateway_pb2.SyncMember]) -> bool:
    # A member that reports no GPU identity (an older client) counts as a GPU of its own, as before identities.
    gpus = [gpu for m in members for gpu in m.gpu_uuids]
    return len(gpus) == len(set(gpus))


def choose_backend(requested: str, members: Sequence[gateway_pb2.SyncMember]) -> str:
    """The transport of a full group; `members[0]` is the trainer.

    `auto`: any member without a GPU -> gloo; every member on the trainer's host and its one GPU -> cuda_ipc;
    each member on a GPU of its own -> nccl (NCCL cannot put two ranks on one GPU); otherwise (some members
    share a GPU, not all) -> gloo. An explicit method that cannot work on these members is refused.
    """
    all_gpu = bool(members) and all(m.has_gpu for m in members)
    if requested == "auto":
        if not all_gpu:
            return "gloo"
        if _one_gpu_shared_by_all(members):
            return "cuda_ipc"
        return "nccl" if _no_gpu_shared(members) else "gloo"
    if requested == "nccl" and not (all_gpu and _no_gpu_shared(members)):
        raise InvalidArgument(
            "synchronizer.method", "nccl needs a GPU of its own on every member; use auto, gloo or checkpoint"
        )
    if requested == "cuda_ipc" and not (all_gpu and _one_gpu_shared_by_all(members)):
        raise InvalidArgument(
            "synchronizer.method", "cuda_ipc needs every member on the trainer's host and GPU; use auto or nccl"
        )
    return requested


def member(
    instance_id: str, rank: int, has_gpu: bool, host_id: str, gpu_uuids: Sequence[str], ranks: int = 0
) -> gateway_pb2.SyncMember:
    """A member as reported, its placement fields checked (INVALID_ARGUMENT naming the field). `ranks`: its engine's
    workers, each a rank from `rank` on (0 means 1)."""
    if not 0 <= ranks <= MAX_MEMBER_RANKS:
        raise InvalidArgument("ranks", f"{ranks}: a member takes 1 to {MAX_MEMBER_RANKS} ranks (its engine's workers)")
    bounded(host_id, "host_id")
    if len(gpu_uuids) > MAX_MEMBER_GPUS:
        raise InvalidArgument("gpu_uuids", f"{len(gpu_uuids)} entries; at most {MAX_MEMBER_GPUS} are allowed")
    for uuid in gpu_uuids:
        bounded(uuid, "gpu_uuids")
    if gpu_uuids and not has_gpu:
        raise InvalidArgument("gpu_uuids", "reported without has_gpu")
    return gateway_pb2.SyncMember(
        instance_id=instance_id, rank=rank, has_gpu=has_gpu, host_id=host_id, gpu_uuids=list(gpu_uuids), ranks=ranks
    )


def member_ranks(member: gateway_pb2.SyncMember) -> int:
    return member.ranks or 1


class SyncGroups:
    def __init__(self, client: redis.Redis, *, issue_secrets: bool = False) -> None:
        """`issue_secrets`: the gateway has a token, so it can hand secrets to authenticated callers only."""
        self.client = client
        self.issue_secrets = issue_secrets

    def _new_secret(self) -> bytes:
        return secrets.token_bytes(SECRET_BYTES) if self.issue_secrets else b""

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

    def open(
        self, request: gateway_pb2.OpenSyncGroupRequest, members: Callable[[], int] | None = None
    ) -> gateway_pb2.SyncGroup:
        """A new generation of the run's group. `members`: the explorers it waits for, read under the run's lock (the
        run's explorers now: whoever changes them does so before it closes the generation, so a generation opened
        on an older count is closed after); 0 or None leaves the request's `explorer_workers`."""
        # world_size = explorer_workers + 1 is an int32 too: 2**31 - 1 workers would overflow it.
        if not 1 <= request.explorer_workers <= MAX_SYNC_WORKERS:
            raise InvalidArgument("explorer_workers", f"must be between 1 and {MAX_SYNC_WORKERS}")
        if request.backend not in METHODS:
            raise InvalidArgument("backend", f"must be one of {', '.join(METHODS)} (synchronizer.method)")
        bounded(request.host, "host")
        bounded(request.checkpoint_dir, "checkpoint_dir", MAX_PATH_CHARS)
        trainer = member(request.instance_id, 0, request.has_gpu, request.host_id, request.gpu_uuids)
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
            workers = (members() if members else 0) or request.explorer_workers
            group = gateway_pb2.SyncGroup(
                run_id=request.run_id,
                generation=generation,
                backend=request.backend,
                host=request.host,
                port=request.port,
                world_size=workers + 1,
                members_expected=workers,
                members=[trainer],
                announced_version=-1,
                checkpoint_dir=request.checkpoint_dir,
                timeout_seconds=request.timeout_seconds,
                bucket_mb=request.bucket_mb,
                secret=self._new_secret(),
            )
            self._save(group)
            return group

    def join(self, request: gateway_pb2.JoinSyncGroupRequest) -> gateway_pb2.SyncGroup:
        run_id, instance_id = request.run_id, request.instance_id
        with self.client.lock(keys.lock(run_id), timeout=10, blocking_timeout=10):
            group = self.get(run_id)
            mine = [m for m in group.members if m.instance_id == instance_id]
            if mine:
                group.rank = mine[0].rank
                return group
            expected = group.members_expected + 1  # with the trainer; 1 for a closed generation (full)
            if len(group.members) >= expected:
                raise FailedPrecondition(
                    f"sync group of run {run_id!r} (generation {group.generation}) is full; "
                    "it is re-formed when a member leaves"
                )
            # The next free rank: a member with several engine workers holds one per worker, consecutively.
            rank = sum(member_ranks(m) for m in group.members)
            joining = member(instance_id, rank, request.has_gpu, request.host_id, request.gpu_uuids, request.ranks)
            group.members.append(joining)
            group.world_size += member_ranks(joining) - 1
            if len(group.members) == expected:
                group.backend = choose_backend(group.backend, group.members)
                group.ready = True
                SYNC_GROUPS_FORMED.inc()
            self._save(group)
            group.rank = rank
            return group

    def rank_secret(self, run_id: str) -> bytes:
        """The secret of the run's trainer ranks, made on the first request (empty without secrets)."""
        if not self.issue_secrets:
            return b""
        key = keys.rank_secret(run_id)
        self.client.set(key, self._new_secret(), nx=True)  # the leader and each follower ask: one secret per run
        return cast("bytes", self.client.get(key))

    def announce(self, run_id: str, generation: int, version: int) -> gateway_pb2.SyncGroup:
        with self.client.lock(keys.lock(run_id), timeout=10, blocking_timeout=10):
            group = self.get(run_id)
            if generation != group.generation:
                raise FailedPrecondition(f"generation {generation} is over; the current one is {group.generation}")
            if version == group.announced_version:
                # The same announcement again: a retry whose first reply was lost on the way (a connection that
                # dropped after the gateway answered). Announced already; saying so again changes nothing.
                return group
            if version < group.announced_version:
                raise FailedPrecondition(
                    f"weight versions only increase: {version} < announced {group.announced_version}"
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
            group.world_size = group.members_expected = 0  # nobody can join a closed generation
            self._save(group)
            return group
