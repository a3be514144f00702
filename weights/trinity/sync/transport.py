"""One member's end of a gloo or NCCL process group: collectives with a timeout, failures as `SyncError`.

The group is built directly from a `TCPStore` + `PrefixStore` (not `init_process_group`), so it never
touches the default group a trainer may already use for FSDP/Megatron, and several generations can
live in one process. gloo and NCCL share every line except the process-group constructor and the device.

Nothing here changes the process's environment: what NCCL reads from it at construction (blocking wait, error
handling) would also reach every later group of the process, the trainer's FSDP/Megatron groups included. A
collective is bounded by `work.wait(timeout)` on the calling thread instead, and a failed group is aborted at once.
"""

from __future__ import annotations

import contextlib
import struct
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trinity.sync.errors import SyncError, as_sync_error
from trinity.sync.membership import MembershipRefused, SignedStore, allgather_exchange, prove_membership
from trinity.sync.protocol import decode_message, encode_message
from trinity.sync.spec import SyncGroupSpec

PROCESS_GROUP_BACKENDS = ("gloo", "nccl")
# NCCL's watchdog tears the whole process down when an operation outlives the group's own timeout. Ours, the
# bound passed to `work.wait`, fires this much earlier, so the calling thread sees the failure first and aborts
# the group (which stops the watchdog) before that could happen.
NCCL_WATCHDOG_GRACE = timedelta(seconds=30)


def default_device(backend: str) -> torch.device:
    if backend in ("nccl", "cuda_ipc"):
        if not torch.cuda.is_available():
            raise SyncError(f"backend {backend!r} needs a CUDA device; use backend 'gloo' (CPU) or 'checkpoint'")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_device(backend: str, device: torch.device | str | None) -> torch.device:
    """The device a member sends from or receives into: `device`, else the backend's default (cuda:N with N set)."""
    resolved = torch.device(device) if device is not None else default_device(backend)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def open_store(spec: SyncGroupSpec, rank: int, store: Any = None) -> tuple[Any, Any]:
    """`(store, this generation's PrefixStore)`: rank 0 passes its reserved rendezvous store, others connect. With
    the generation's secret, every value written there is signed and checked on read (`SignedStore`)."""
    if store is None:
        if spec.port == 0:
            raise SyncError(f"sync group {spec.name}: port 0; the trainer must reserve_rendezvous() first")
        store = dist.TCPStore(
            spec.host,
            spec.port,
            spec.world_size,
            is_master=rank == 0,
            timeout=spec.join_timeout,
            wait_for_workers=False,
        )
    generation = dist.PrefixStore(spec.store_prefix, store)
    secret = spec.secret_bytes
    return store, generation if secret is None else SignedStore(generation, secret, spec.store_prefix, rank)


class GroupTransport:
    """Broadcast from rank 0 and allgather, each bounded by `spec.timeout_s`; broken after the first failure."""

    def __init__(self, spec: SyncGroupSpec, rank: int, device: torch.device | str | None = None, store: Any = None):
        if spec.backend not in PROCESS_GROUP_BACKENDS:
            raise ValueError(f"backend {spec.backend!r} is not a process-group backend")
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} outside 0..{spec.world_size - 1} of sync group {spec.name}")
        self.spec, self.rank = spec, rank
        self.device = resolve_device(spec.backend, device)
        self._store = store
        self._group: Any = None
        self._prefixed: Any = None
        self.broken: str | None = None

    @property
    def store(self) -> Any:
        """The group's prefixed key-value store (for doorbells outside the collectives)."""
        return self._prefixed

    def guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Any failure inside (the group, the store, a device copy) is a `SyncError` and breaks the group."""
        return as_sync_error(
            f"sync group {self.spec.name} generation {self.spec.generation} rank {self.rank}: {what}", self.mark_broken
        )

    def mark_broken(self, reason: str) -> None:
        """Record the first failure and abort the group: its peers may be dead or stalled, and an NCCL
        communicator that saw an error must be aborted (not destroyed, which waits for every peer)."""
        if self.broken is None:
            self.broken = reason
        if self._group is not None:
            with contextlib.suppress(Exception):
                self._group.abort()

    def connect(self) -> None:
        spec = self.spec
        try:
            self._store, self._prefixed = open_store(spec, self.rank, self._store)
            self._group = self._make_group(self._prefixed)
            if (secret := spec.secret_bytes) is not None:
                # Before the first message: every member holds this generation's secret (trinity.sync.membership).
                exchange = allgather_exchange(self._group, spec.world_size, self.device, spec.timeout)
                prove_membership(exchange, secret, spec.store_prefix, self.rank)
        except SyncError:
            raise
        except MembershipRefused as refused:
            self.mark_broken(str(refused))
            raise SyncError(
                f"sync group {spec.name} generation {spec.generation} refused by rank {self.rank}: {refused}"
            ) from refused
        except Exception as err:
            self.mark_broken(repr(err))
            raise SyncError(
                f"could not join sync group {spec.name} generation {spec.generation} at {spec.host}:{spec.port} "
                f"as rank {self.rank} within {spec.join_timeout_s}s: {err}"
            ) from err

    def _make_group(self, store: Any) -> Any:
        spec = self.spec
        # Joining waits for the slowest member to start (join_timeout_s); each collective then gets timeout_s.
        if spec.backend == "gloo":
            group = dist.ProcessGroupGloo(store, self.rank, spec.world_size, spec.join_timeout)
            group._set_default_timeout(spec.timeout)
            return group
        if self.device.type != "cuda":
            raise SyncError(f"backend 'nccl' needs a CUDA device; sync group {spec.name} was given {self.device}")
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise SyncError("this torch build has no NCCL; install a CUDA build or use backend 'gloo'")
        options = nccl.Options()
        options._timeout = spec.join_timeout
        group = nccl(store, self.rank, spec.world_size, options)
        try:
            # The communicator is made now, on this member's device: not later on whatever device the calling
            # thread has current (cuda:0 in a fresh thread), and a member that cannot join fails here.
            group.eager_connect_single_device(self.device)
        except BaseException:
            with contextlib.suppress(Exception):
                group.abort()
            raise
        group._set_default_timeout(self.operation_timeout)
        return group

    @property
    def operation_timeout(self) -> timedelta:
        """The group's own bound on an operation; `spec.timeout` is enforced by `work.wait` before it."""
        return self.spec.timeout + NCCL_WATCHDOG_GRACE if self.spec.backend == "nccl" else self.spec.timeout

    def ensure_usable(self) -> None:
        if self._group is None:
            raise SyncError("sync group not joined; call init() first")
        if self.broken is not None:
            raise SyncError(
                f"sync group {self.spec.name} generation {self.spec.generation} is broken ({self.broken}); "
                "close it and re-form it with a new generation"
            )

    def _wait(self, work: Any, what: str) -> None:
        try:
            work.wait(timedelta(seconds=self.spec.timeout_s))
        except Exception as err:
            self.mark_broken(f"{what}: {err}")
            raise SyncError(
                f"sync group {self.spec.name} generation {self.spec.generation}: {what} failed on rank {self.rank} "
                f"(a member died or stalled; timeout {self.spec.timeout_s}s): {err}"
            ) from err

    def broadcast(self, tensor: torch.Tensor, what: str = "broadcast") -> None:
        """In place on every rank: rank 0's `tensor` is sent, the others' is overwritten."""
        self.wait(self.broadcast_async(tensor, what))

    def broadcast_async(self, tensor: torch.Tensor, what: str = "broadcast") -> tuple[Any, str]:
        """Start a broadcast; `wait()` on the handle before touching `tensor` again."""
        self.ensure_usable()
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        options.timeout = self.operation_timeout
        try:
            return self._group.broadcast([tensor], options), what
        except Exception as err:
            self.mark_broken(f"{what}: {err}")
            raise SyncError(f"{what} failed on rank {self.rank}: {err}") from err

    def wait(self, handle: tuple[Any, str]) -> None:
        self._wait(*handle)

    def send_message(self, message: dict[str, Any]) -> None:
        payload = encode_message(message, self.device)
        self.broadcast(self._length(payload.numel()), f"{message['kind']} header")
        self.broadcast(payload, f"{message['kind']} message")

    def recv_message(self) -> dict[str, Any]:
        length = self._length(0)
        self.broadcast(length, "message header")
        (size,) = struct.unpack("<q", bytes(length.cpu().numpy()))
        payload = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.broadcast(payload, "message")
        return decode_message(payload)

    def _length(self, size: int) -> torch.Tensor:
        # 8 raw bytes rather than an int64 tensor: one dtype (uint8) for every control broadcast.
        return torch.frombuffer(bytearray(struct.pack("<q", size)), dtype=torch.uint8).to(self.device)

    def allgather_status(self, status: int, version: int) -> list[tuple[int, int]]:
        """Every rank's `(status, version)`, indexed by rank."""
        self.ensure_usable()
        mine = torch.tensor([status, version], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.spec.world_size)]
        try:
            work = self._group.allgather([out], [mine])
        except Exception as err:
            self.mark_broken(f"status: {err}")
            raise SyncError(f"status exchange failed on rank {self.rank}: {err}") from err
        self._wait(work, "status exchange")
        return [(int(t[0]), int(t[1])) for t in out]

    def close(self) -> None:
        """Returns without waiting for peers after a failure (the group was aborted then); a healthy group is
        shut down cleanly."""
        group, self._group = self._group, None
        if group is not None and self.broken is None:
            with contextlib.suppress(Exception):
                group.shutdown()
        self._prefixed = None
        self._store = None
