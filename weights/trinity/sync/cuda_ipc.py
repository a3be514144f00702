"""Weight sync through shared memory on one GPU: backend `cuda_ipc` (NCCL cannot put two ranks on one GPU).

There is no process group. The generation's store (the trainer's rendezvous TCPStore, under the prefix
`trinity-sync/<name>/g<generation>`) carries JSON control messages and buffer handles; the bytes travel
through a buffer the sender shares and each receiver copies out of (device to device on the same GPU).

    ipc/sender              identity             sender, at init: host and GPU whose memory it shares
    ipc/joined/<rank>       "ok" | "error: .."   each receiver, after checking it is on that host and GPU
    update/<seq>            version              the doorbell, as for gloo / nccl
    u<seq>/msg/<i>          chunk|finish|abort   i = 0, 1, ...; chunk = layout, buffer handle, bucket checksums
    u<seq>/done/<i>/<rank>  "ok" | "error: .."   the receiver has copied chunk i out of the shared buffer
    u<seq>/status/<rank>    status code          after finish: accepted or why refused (as the allgather)

Two shared buffers alternate: chunk i is written while receivers copy chunk i-1, and a buffer is rewritten
or freed only once every receiver marked the chunk it held done. Checksums, refusal and the engine contract
are those of the collective backends (`trinity.sync.collective`): nothing is handed over before every
bucket of the version matched. The sender deletes a version's keys once every status is in.

How memory is shared is the only CUDA-specific part (`CudaSharing`: `reduce_tensor` handles, sent as JSON,
never pickles). On a CPU device `HostSharing` (files in /dev/shm) stands in, so the whole protocol runs and
is tested without a GPU. `python -m trinity.sync.cuda_ipc --mb 256` is the check for a GPU machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch

from trinity.runtime.logging import get_logger
from trinity.sync.checksum import BucketChecksums, checksum_bytes, tensor_bytes
from trinity.sync.collective import (
    BucketHook,
    StreamBuffers,
    doorbell,
    hand_over,
    raise_refusal,
    verdict,
    wait_for_doorbell,
)
from trinity.sync.errors import NoUpdateYet, StaleVersion, SyncError, as_sync_error
from trinity.sync.interface import NamedTensors, SyncReceiver, SyncReport, SyncSender, register_sync_backend
from trinity.sync.placement import device_identity
from trinity.sync.protocol import CHUNK, FINISH, STATUS_NAMES, STATUS_OK, STATUS_PROTOCOL, ChunkLayout
from trinity.sync.spec import Rendezvous, SyncGroupSpec
from trinity.sync.transport import open_store, resolve_device

log = get_logger("trinity.sync")
ABORT = "abort"
SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
SHM_PREFIX = "trinity-sync-"


class Sharing(Protocol):
    """How a buffer is allocated in memory another process can map, described, opened there, and fenced."""

    def allocate(self, size: int, device: torch.device) -> torch.Tensor: ...
    def describe(self, buffer: torch.Tensor) -> dict[str, Any]: ...
    def open(self, description: dict[str, Any], device: torch.device) -> torch.Tensor: ...
    def fence(self, device: torch.device) -> None: ...
    def free(self, buffer: torch.Tensor) -> None: ...


CUDA_IPC_FIELDS = 15  # rebuild_cuda_tensor's arguments, unchanged since torch 1.x


def encode_cuda_handle(args: tuple[Any, ...]) -> dict[str, Any]:
    """`reduce_tensor(buffer)[1]` of a 1-D uint8 CUDA buffer as JSON-able data (handles in base64)."""
    if len(args) != CUDA_IPC_FIELDS:
        raise SyncError(f"this torch's CUDA IPC handle has {len(args)} fields, not {CUDA_IPC_FIELDS}; use nccl")
    (
        _,
        size,
        _,
        offset,
        _,
        _,
        _,  # the sender's device index: the receiver uses its own index of the same GPU
        handle,
        storage_bytes,
        storage_offset,
        _,
        counter,
        counter_offset,
        event,
        sync,
    ) = args

    def b64(value: bytes | None) -> str | None:
        return None if value is None else base64.b64encode(value).decode()

    return {
        "numel": int(size[0]),
        "offset": int(offset),
        "handle": b64(handle),
        "storage_bytes": int(storage_bytes),
        "storage_offset": int(storage_offset),
        "ref_counter": b64(counter),
        "ref_counter_offset": int(counter_offset),
        "event": b64(event),
        "event_sync": bool(sync),
    }


def decode_cuda_handle(description: dict[str, Any], device_index: int) -> tuple[Any, ...]:
    """The arguments of `rebuild_cuda_tensor` for an encoded handle (the types are always a uint8 tensor's).

    `device_index` is the receiver's index of the GPU: the join checked it is the sender's GPU (by UUID), but
    each process numbers its visible GPUs itself (CUDA_VISIBLE_DEVICES), so the sender's index can differ.
    """

    def raw(value: str | None) -> bytes | None:
        return None if value is None else base64.b64decode(value)

    d = description
    return (
        torch.Tensor,
        torch.Size([d["numel"]]),
        (1,),
        d["offset"],
        torch.storage.TypedStorage,
        torch.uint8,
        device_index,
        raw(d["handle"]),
        d["storage_bytes"],
        d["storage_offset"],
        False,
        raw(d["ref_counter"]),
        d["ref_counter_offset"],
        raw(d["event"]),
        d["event_sync"],
    )


class CudaSharing:
    """CUDA IPC handles of torch's caching allocator, with torch's own cache and reference counting."""

    def allocate(self, size: int, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=torch.uint8, device=device)

    def describe(self, buffer: torch.Tensor) -> dict[str, Any]:
        from torch.multiprocessing.reductions import reduce_tensor

        _, args = reduce_tensor(buffer)
        return encode_cuda_handle(args)

    def open(self, description: dict[str, Any], device: torch.device) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        index = device.index if device.index is not None else torch.cuda.current_device()
        return rebuild_cuda_tensor(*decode_cuda_handle(description, index))  # type: ignore[no-untyped-call]

    def fence(self, device: torch.device) -> None:
        # A reopened handle is served from torch's cache without waiting on the producer's event, so the
        # writer finishes its copies before it publishes a handle and the reader before it marks a chunk done.
        torch.cuda.current_stream(device).synchronize()

    def free(self, buffer: torch.Tensor) -> None:
        pass  # the caching allocator keeps a block alive while a consumer still maps it


class HostSharing:
    """Host shared memory, one file per buffer under /dev/shm: the stand-in for CUDA IPC on a CPU device."""

    def __init__(self) -> None:
        self._paths: dict[int, Path] = {}

    def allocate(self, size: int, device: torch.device) -> torch.Tensor:
        path = SHM / f"{SHM_PREFIX}{uuid.uuid4().hex}"
        buffer = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        self._paths[buffer.data_ptr()] = path
        return buffer

    def describe(self, buffer: torch.Tensor) -> dict[str, Any]:
        return {"path": self._paths[buffer.data_ptr()].name, "size": buffer.numel()}

    def open(self, description: dict[str, Any], device: torch.device) -> torch.Tensor:
        name = str(description["path"])
        if not name.startswith(SHM_PREFIX) or "/" in name:
            raise SyncError(f"refusing shared buffer {name!r}: not a {SHM_PREFIX}* file in {SHM}")
        path = SHM / name
        if not path.is_file():
            raise SyncError(f"shared buffer {path} does not exist (the sender freed it, or is on another host)")
        return torch.from_file(str(path), shared=False, size=int(description["size"]), dtype=torch.uint8)

    def fence(self, device: torch.device) -> None:
        pass

    def free(self, buffer: torch.Tensor) -> None:
        path = self._paths.pop(buffer.data_ptr(), None)
        if path is not None:
            path.unlink(missing_ok=True)


def sharing_for(device: torch.device) -> Sharing:
    return CudaSharing() if device.type == "cuda" else HostSharing()


def _receiver_ranks(spec: SyncGroupSpec) -> range:
    return range(1, spec.world_size)


class _Member:
    """What both ends share: the store with bounded waits, JSON messages, failures as `SyncError`."""

    spec: SyncGroupSpec
    rank: int
    device: torch.device
    store: Any
    broken: str | None

    def guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        return as_sync_error(
            f"sync group {self.spec.name} generation {self.spec.generation} rank {self.rank}: {what}", self.mark_broken
        )

    def mark_broken(self, reason: str) -> None:
        self.broken = reason

    def ensure_usable(self) -> None:
        if self.store is None:
            raise SyncError("sync group not joined; call init() first")
        if self.broken is not None:
            raise SyncError(
                f"sync group {self.spec.name} generation {self.spec.generation} is broken ({self.broken}); "
                "close it and re-form it with a new generation"
            )

    def wait(self, keys: list[str], timeout: timedelta, what: str) -> list[bytes]:
        """The values of `keys` once all are set; `SyncError` naming `what` after `timeout`."""
        if not keys:
            return []
        try:
            self.store.wait(keys, timeout)
        except Exception as err:
            reason = f"{what} failed on rank {self.rank} (a member died or stalled; bound {timeout.total_seconds():g}s)"
            self.mark_broken(reason)
            raise SyncError(f"sync group {self.spec.name} generation {self.spec.generation}: {reason}: {err}") from err
        return [bytes(self.store.get(key)) for key in keys]

    def put(self, key: str, message: dict[str, Any]) -> None:
        self.store.set(key, json.dumps(message, separators=(",", ":")))

    def take(self, key: str, what: str) -> dict[str, Any]:
        (raw,) = self.wait([key], self.spec.timeout, what)
        message = json.loads(raw)
        if not isinstance(message, dict) or "kind" not in message:
            raise SyncError(f"malformed sync message at {key}: {raw[:200]!r}")
        return message


def _failures(values: list[bytes], ranks: range) -> dict[int, str]:
    return {rank: value.decode() for rank, value in zip(ranks, values, strict=True) if value != b"ok"}


class IpcSender(_Member, SyncSender):
    """The trainer: writes each chunk into a shared buffer, waits for every receiver before reusing it."""

    def __init__(
        self,
        spec: SyncGroupSpec,
        *,
        rendezvous: Rendezvous | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if spec.backend != "cuda_ipc":
            raise ValueError(f"backend {spec.backend!r} is not 'cuda_ipc'")
        self.spec, self.rank = spec, 0
        self.device = resolve_device(spec.backend, device)
        self.sharing = sharing_for(self.device)
        self.checksums = BucketChecksums(spec)
        self._root = rendezvous.store if rendezvous else None
        self.store: Any = None
        self.broken: str | None = None
        self.last_version: int | None = None
        self._version: int | None = None
        self._report: SyncReport | None = None
        self._started_at = 0.0
        self._seq = 0
        self._messages = 0  # messages posted in the open version
        self._acked = -1  # the last chunk every receiver has copied out
        self._slots: list[torch.Tensor | None] = [None, None]

    def init(self) -> None:
        with self.guard("join"):
            self._root, self.store = open_store(self.spec, 0, self._root)
            self.store.set("ipc/sender", device_identity(self.device))
            ranks = _receiver_ranks(self.spec)
            joined = self.wait([f"ipc/joined/{r}" for r in ranks], self.spec.join_timeout, "joining")
            if refused := _failures(joined, ranks):
                raise SyncError(f"members could not join the cuda_ipc group: {refused}")
        log.info("sync.joined", group=self.spec.name, generation=self.spec.generation, rank=0, backend="cuda_ipc")

    def start(self, version: int) -> None:
        self.ensure_usable()
        if self._version is not None:
            raise SyncError(f"version {self._version} is still open; finish() it before starting {version}")
        if self.last_version is not None and version <= self.last_version:
            raise StaleVersion(f"version {version} is not newer than the last published {self.last_version}")
        self._seq += 1
        self._messages, self._acked = 0, -1
        with self.guard(f"start of version {version}"):
            self.store.set(doorbell(self._seq), str(version))
        self._version, self._report = version, SyncReport(version=version)
        self._started_at = time.perf_counter()

    def update(self, named_tensors: NamedTensors) -> None:
        if self._version is None or self._report is None:
            raise SyncError("update() outside start()/finish()")
        try:
            with self.guard(f"chunk {self._messages} of version {self._version}"):
                named = [(name, tensor.detach()) for name, tensor in named_tensors]
                self._send_chunk(named, self._version, self._report)
        except SyncError as err:
            self.abandon(str(err))
            raise

    def _send_chunk(self, named: list[tuple[str, torch.Tensor]], version: int, report: SyncReport) -> None:
        layout = ChunkLayout.plan(named, self.spec.bucket_bytes)
        index = self._messages
        self._wait_done_through(index - 2)  # the slot's previous chunk has been copied out by everyone
        buffer = self._slot(index % 2, layout.total_bytes)
        sources = [tensor_bytes(tensor) for _, tensor in named]
        checksum = self.checksums.of_chunk(version, index, layout)
        sums = []
        for bucket in range(layout.bucket_count):
            piece = buffer[slice(*layout.bucket_range(bucket))]
            data = layout.fill_bucket(bucket, sources, piece)
            if data.data_ptr() != piece.data_ptr():  # a bucket inside one tensor comes back as that tensor
                piece.copy_(data)
            sums.append(checksum(bucket, piece))
        self.sharing.fence(self.device)
        handle = self.sharing.describe(buffer) if layout.total_bytes else None
        self._post({"kind": CHUNK, "layout": layout.to_message(), "buffer": handle, "checksums": sums})
        report.tensors += len(named)
        report.bytes += layout.total_bytes
        report.buckets += layout.bucket_count

    def _slot(self, slot: int, size: int) -> torch.Tensor:
        buffer = self._slots[slot]
        if buffer is None or buffer.numel() < size:
            if buffer is not None:
                self.sharing.free(buffer)
            # A bucket's worth at least, so a model of bucket-sized chunks allocates each slot once.
            buffer = self._slots[slot] = self.sharing.allocate(max(size, self.spec.bucket_bytes), self.device)
        return buffer

    def _post(self, message: dict[str, Any]) -> None:
        self.put(f"u{self._seq}/msg/{self._messages}", message)
        self._messages += 1

    def _wait_done_through(self, last: int) -> None:
        ranks = _receiver_ranks(self.spec)
        for chunk in range(self._acked + 1, last + 1):
            keys = [f"u{self._seq}/done/{chunk}/{r}" for r in ranks]
            if failed := _failures(self.wait(keys, self.spec.timeout, f"copying chunk {chunk}"), ranks):
                raise SyncError(f"receivers could not copy chunk {chunk} of version {self._version}: {failed}")
            self._acked = chunk

    def finish(self, version: int) -> SyncReport:
        if self._version != version or self._report is None:
            raise SyncError(f"finish({version}) does not match the open version {self._version}")
        ranks = _receiver_ranks(self.spec)
        try:
            with self.guard(f"finish of version {version}"):
                chunks = self._messages
                self._wait_done_through(chunks - 1)
                digest = self.sent_digest()
                self._post({"kind": FINISH, "version": version, "chunks": chunks, "digest": digest})
                statuses = self.wait([f"u{self._seq}/status/{r}" for r in ranks], self.spec.timeout, "status")
                self._forget(chunks)
        except SyncError as err:
            self.abandon(str(err))
            raise
        report = self._report
        report.seconds, report.digest = time.perf_counter() - self._started_at, digest
        report.refused = {
            rank: STATUS_NAMES.get(int(value), value.decode())
            for rank, value in zip(ranks, statuses, strict=True)
            if int(value) != STATUS_OK
        }
        self.last_version, self._version, self._report = version, None, None
        event = log.info if report.accepted_by_all else log.warning
        event(
            "weights.published",
            group=self.spec.name,
            version=version,
            backend="cuda_ipc",
            tensors=report.tensors,
            bytes=report.bytes,
            buckets=report.buckets,
            seconds=round(report.seconds, 4),
            refused=report.refused,
        )
        return report

    def _forget(self, chunks: int) -> None:
        """Every member is past this version: its keys would only grow the store."""
        ranks = _receiver_ranks(self.spec)
        keys = [doorbell(self._seq), *(f"u{self._seq}/status/{r}" for r in ranks)]
        for chunk in range(chunks + 1):
            keys += [f"u{self._seq}/msg/{chunk}", *(f"u{self._seq}/done/{chunk}/{r}" for r in ranks)]
        for key in keys:
            self.store.delete_key(key)

    def abandon(self, reason: str) -> None:
        transport_failed = self.broken is not None
        if self.store is not None and self._version is not None:
            with contextlib.suppress(Exception):
                chunks = self._messages
                # Receivers waiting for the next message learn it at once instead of after their timeout.
                self._post({"kind": ABORT, "reason": reason[:2000]})
                if not transport_failed:
                    # Every member is alive (the source failed): they copy out what was posted before they
                    # read the abort, and only then may close() free those buffers.
                    self._wait_done_through(chunks - 1)
        self._version, self._report = None, None
        self.mark_broken(reason)

    def close(self) -> None:
        for buffer in self._slots:
            if buffer is not None:
                self.sharing.free(buffer)
        self._slots = [None, None]
        self.store, self._root, self._version = None, None, None


class IpcReceiver(_Member, SyncReceiver):
    """An explorer on the trainer's GPU: copies each shared chunk out, verifies it, reports its status."""

    def __init__(
        self,
        spec: SyncGroupSpec,
        rank: int,
        *,
        device: torch.device | str | None = None,
        bucket_hook: BucketHook | None = None,
        reuse_buffers: bool = False,
    ) -> None:
        """`bucket_hook` and `reuse_buffers` as for `WeightReceiver`."""
        if spec.backend != "cuda_ipc":
            raise ValueError(f"backend {spec.backend!r} is not 'cuda_ipc'")
        if not 0 < rank < spec.world_size:
            raise ValueError(f"rank {rank}: explorer workers are ranks 1..{spec.world_size - 1}")
        self.spec, self.rank = spec, rank
        self.device = resolve_device(spec.backend, device)
        self.sharing = sharing_for(self.device)
        self.checksums = BucketChecksums(spec)
        self.store: Any = None
        self.broken: str | None = None
        self.version: int | None = None
        self._bucket_hook = bucket_hook
        self._streams = StreamBuffers(self.device, reuse_buffers)
        self._seq = 0

    def init(self) -> None:
        with self.guard("join"):
            _, self.store = open_store(self.spec, self.rank)
            (theirs,) = self.wait(["ipc/sender"], self.spec.join_timeout, "the trainer's arrival")
            mine = device_identity(self.device)
            if theirs.decode() != mine:
                problem = (
                    f"cuda_ipc needs the trainer's GPU: the trainer shares memory on {theirs.decode()}, this "
                    f"explorer is on {mine}; use backend nccl (one GPU each) or gloo"
                )
                self.store.set(f"ipc/joined/{self.rank}", f"error: rank {self.rank}: {problem}")
                raise SyncError(problem)
            self.store.set(f"ipc/joined/{self.rank}", "ok")
        log.info("sync.joined", group=self.spec.name, generation=self.spec.generation, rank=self.rank)

    def receive(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        version = self._wait_for_doorbell(idle_timeout_s)
        with self.guard("receive"):
            chunks: list[tuple[ChunkLayout, torch.Tensor, list[int]]] = []
            sent: list[list[int]] = []
            while (message := self._next_message(version, len(chunks)))["kind"] == CHUNK:
                layout = ChunkLayout.from_message(message["layout"])
                stream = self._streams.get(len(chunks), layout.total_bytes)
                chunks.append((layout, stream, self._copy_out(version, len(chunks), layout, message["buffer"], stream)))
                sent.append(message["checksums"])
            self._conclude(version, message, [s for _, _, s in chunks], sent)
            return version, iter(hand_over(self.spec, self.rank, version, chunks))

    def receive_streamed(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        """As `WeightReceiver.receive_streamed`: each chunk's message carries its checksums, so a chunk is handed
        over once copied out and verified, and only that copy is held."""
        version = self._wait_for_doorbell(idle_timeout_s)
        return version, self._stream_version(version)

    def _stream_version(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        received: list[list[int]] = []
        sent: list[list[int]] = []
        settled = False  # judged (accepted or refused), or the group broke: nothing left to receive
        try:
            while True:
                with self.guard("streamed receive"):
                    message = self._next_message(version, len(received))
                    if message["kind"] == FINISH:
                        settled = True
                        self._conclude(version, message, received, sent)
                        return
                    layout = ChunkLayout.from_message(message["layout"])
                    stream = torch.empty(layout.total_bytes, dtype=torch.uint8, device=self.device)
                    received.append(self._copy_out(version, len(received), layout, message["buffer"], stream))
                    sent.append(message["checksums"])
                if received[-1] != sent[-1]:
                    settled = True  # the rest is copied out unloaded and the version refused
                    with self.guard("streamed receive"):
                        self._drain(version, received, sent)
                    return
                yield from layout.tensors(stream)
                del stream
        finally:
            if not settled and self.broken is None:  # abandoned by the consumer: finish unloaded
                with self.guard("streamed receive, abandoned by the engine"):
                    self._drain(version, received, sent, STATUS_PROTOCOL)

    def _drain(self, version: int, received: list[list[int]], sent: list[list[int]], status: int | None = None) -> None:
        """Copy out the rest of `version` without handing it over, then report and raise its refusal."""
        while (message := self._next_message(version, len(received)))["kind"] == CHUNK:
            layout = ChunkLayout.from_message(message["layout"])
            stream = torch.empty(layout.total_bytes, dtype=torch.uint8, device=self.device)
            received.append(self._copy_out(version, len(received), layout, message["buffer"], stream))
            sent.append(message["checksums"])
        self._conclude(version, message, received, sent, status)

    def _wait_for_doorbell(self, idle_timeout_s: float | None) -> int:
        """Wait for the next update to begin; returns the version it announces."""
        self.ensure_usable()
        self._seq += 1
        try:
            wait_for_doorbell(self.store, self._seq, self.spec, idle_timeout_s)
        except NoUpdateYet:
            self._seq -= 1  # nothing was consumed: the next receive() waits for the same update
            raise
        return int(self.store.get(doorbell(self._seq)))

    def _next_message(self, version: int, index: int) -> dict[str, Any]:
        """Message `index` of the update: a CHUNK or FINISH (an abandoned or unexpected one raises `SyncError`)."""
        message = self.take(f"u{self._seq}/msg/{index}", f"message {index} of version {version}")
        if message["kind"] == ABORT:
            self.mark_broken(f"the trainer abandoned version {version}")
            raise SyncError(f"the trainer abandoned version {version}: {message.get('reason')}")
        if message["kind"] not in (CHUNK, FINISH):
            self.mark_broken(f"unexpected message {message['kind']}")
            raise SyncError(f"sync protocol error on rank {self.rank}: unexpected message {message['kind']}")
        return message

    def _conclude(
        self,
        version: int,
        finish: dict[str, Any],
        received: list[list[int]],
        sent: list[list[int]],
        status: int | None = None,
    ) -> None:
        """Judge the version, report to the trainer, raise a refusal; record an accepted one. `status`: report this
        instead of the verdict (an update abandoned by the engine)."""
        verdict_status, problem = verdict(
            version, int(finish["version"]), received, sent, self.version, self.checksums.authenticated
        )
        if status is not None and verdict_status == STATUS_OK:
            verdict_status, problem = status, f"version {version}: the engine stopped loading it part-way"
        self.store.set(f"u{self._seq}/status/{self.rank}", str(verdict_status))
        raise_refusal(verdict_status, problem, self.spec, self.rank, version)
        self.version, self.published_digest = version, finish.get("digest")

    def _copy_out(
        self, version: int, chunk: int, layout: ChunkLayout, handle: dict[str, Any] | None, stream: torch.Tensor
    ) -> list[int]:
        """Copy a shared chunk into `stream` and return its checksums; the sender may reuse the buffer once every
        copy is done."""
        done = f"u{self._seq}/done/{chunk}/{self.rank}"
        try:
            if layout.total_bytes:
                if handle is None:
                    raise SyncError(f"chunk {chunk} has {layout.total_bytes} bytes but no shared buffer")
                shared = self.sharing.open(handle, self.device)
                stream.copy_(shared[: layout.total_bytes])
                del shared  # drop the mapping now, so the sender's allocator can reclaim a replaced buffer
                self.sharing.fence(self.device)
        except Exception as err:
            self.store.set(done, f"error: {err!r}"[:2000])
            raise
        self.store.set(done, "ok")
        checksum = self.checksums.of_chunk(version, chunk, layout)
        sums = []
        for index in range(layout.bucket_count):
            bucket = stream[slice(*layout.bucket_range(index))]
            if self._bucket_hook is not None:
                self._bucket_hook(chunk, index, bucket)
            sums.append(checksum(index, bucket))
        return sums

    def close(self) -> None:
        self.store = None
        self._streams.clear()


register_sync_backend("cuda_ipc", IpcSender, IpcReceiver)


# ---- the check for a GPU machine: two processes on one device ----------------------------------------------


def _check_weights(megabytes: float, device: str) -> list[tuple[str, torch.Tensor]]:
    """Mixed fp32 / bf16 matrices of about `megabytes` in total, on `device`."""
    g = torch.Generator(device=device).manual_seed(0)
    out, total, i = [], 0, 0
    while total < megabytes * 2**20:
        dtype = torch.bfloat16 if i % 3 == 1 else torch.float32
        tensor = torch.randn(1024, 1024 + 64 * (i % 5), generator=g, device=device).to(dtype)
        out.append((f"model.layers.{i}.mlp.weight", tensor))
        total += tensor.numel() * tensor.element_size()
        i += 1
    return out


def _tensor_sums(named: Iterator[tuple[str, torch.Tensor]] | list[tuple[str, torch.Tensor]]) -> list[int]:
    return [checksum_bytes("xxh3_64", tensor_bytes(t)) for _, t in named]


def _check_receiver(spec_json: str, device: str, rounds: int, results: Any) -> None:
    try:
        receiver = IpcReceiver(SyncGroupSpec.model_validate_json(spec_json), 1, device=device, reuse_buffers=True)
        receiver.init()
        for _ in range(rounds):
            version, named = receiver.receive(idle_timeout_s=300)
            results.put((version, _tensor_sums(named)))
        receiver.close()
    except Exception as err:  # noqa: BLE001 - the check reports the receiver's failure instead of hanging
        results.put((-1, repr(err)))


def check(megabytes: float = 256.0, rounds: int = 5, device: str = "cuda:0", bucket_mb: float = 64.0) -> dict[str, Any]:
    """This process sends `rounds` versions of ~`megabytes` to a spawned receiver on the same `device`.

    Each round changes one tensor, so a receiver served stale bytes fails the comparison. Every tensor's
    checksum on the receiver must equal the sender's. Returns a JSON-able summary (medians over rounds).
    """
    import multiprocessing as mp
    import statistics

    from trinity.sync.spec import reserve_rendezvous

    weights = _check_weights(megabytes, device)
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members(
            f"ipc-check-{uuid.uuid4().hex[:8]}",
            0,
            ["explorer-0"],
            backend="cuda_ipc",
            bucket_mb=bucket_mb,
            timeout_s=120,
            join_timeout_s=300,
        )
    )
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_check_receiver, args=(rendezvous.spec.model_dump_json(), device, rounds, results))
    process.start()
    seconds, expected, refused = [], {}, {}
    try:
        sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device=device)
        sender.init()
        for version in range(1, rounds + 1):
            weights[0][1].fill_(float(version))
            expected[version] = _tensor_sums(weights)
            started = time.perf_counter()
            report = sender.publish(version, weights)
            seconds.append(time.perf_counter() - started)
            refused.update(report.refused)
        sender.close()
        received = [results.get(timeout=300) for _ in range(rounds)]
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
    failures = [r for r in received if r[0] < 0]
    median = statistics.median(seconds)
    return {
        "backend": "cuda_ipc",
        "device": device,
        "identity": device_identity(torch.device(device)),
        "bytes": nbytes,
        "tensors": len(weights),
        "rounds": rounds,
        "bucket_mb": bucket_mb,
        "checksums_match": not failures and all(sums == expected[v] for v, sums in received),
        "receiver_errors": [r[1] for r in failures],
        "refused": refused,
        "median_s": round(median, 4),
        "gb_per_s": round(nbytes / median / 1e9, 3),
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="cuda_ipc check: two processes on one GPU")
    parser.add_argument("--mb", type=float, default=256.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args()
    summary = check(args.mb, args.rounds, args.device, args.bucket_mb)
    print(json.dumps(summary))
    raise SystemExit(0 if summary["checksums_match"] and not summary["refused"] else 1)
