"""Weight sync over a process group: `WeightSender` on the trainer (rank 0), `WeightReceiver` on explorers.

The same code runs gloo with CPU tensors and NCCL with CUDA tensors; the device is the only difference.
See `trinity.sync.protocol` for the message order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, NoReturn

import torch

from trinity.runtime.failpoints import failpoint
from trinity.runtime.logging import get_logger
from trinity.sync.checksum import BucketChecksums, tensor_bytes
from trinity.sync.errors import ChecksumMismatch, NoUpdateYet, StaleVersion, SyncError
from trinity.sync.interface import NamedTensors, SyncReceiver, SyncReport, SyncSender, register_sync_backend
from trinity.sync.protocol import (
    CHUNK,
    FINISH,
    START,
    STATUS_CHECKSUM,
    STATUS_NAMES,
    STATUS_OK,
    STATUS_PROTOCOL,
    STATUS_STALE,
    ChunkLayout,
)
from trinity.sync.spec import Rendezvous, SyncGroupSpec
from trinity.sync.transport import GroupTransport

log = get_logger("trinity.sync")

BucketHook = Callable[[int, int, torch.Tensor], None]
"""`hook(chunk_index, bucket_index, bucket_bytes)` called on a received bucket before it is verified."""


def doorbell(seq: int) -> str:
    """The store key rank 0 sets when update `seq` (1, 2, ...) begins; its value is the version."""
    return f"update/{seq}"


def wait_for_doorbell(store: Any, seq: int, spec: SyncGroupSpec, idle_timeout_s: float | None) -> None:
    """Idle receivers wait here, on the store (any duration), rather than inside a collective."""
    wait_s = spec.timeout_s if idle_timeout_s is None else idle_timeout_s
    try:
        store.wait([doorbell(seq)], timedelta(seconds=wait_s))
    except Exception as err:
        raise NoUpdateYet(f"no weight update from the trainer within {wait_s}s (or it is gone): {err}") from err


class StreamBuffers:
    """A receiver's chunk buffers; with `reuse`, each version is received into the previous one's buffers."""

    def __init__(self, device: torch.device, reuse: bool) -> None:
        self.device, self.reuse = device, reuse
        self._buffers: list[torch.Tensor] = []

    def get(self, chunk: int, size: int) -> torch.Tensor:
        if not self.reuse:
            return torch.empty(size, dtype=torch.uint8, device=self.device)
        if chunk < len(self._buffers) and self._buffers[chunk].numel() >= size:
            return self._buffers[chunk][:size]
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self._buffers[chunk : chunk + 1] = [buffer]
        return buffer

    def clear(self) -> None:
        self._buffers = []


def verdict(
    version: int,
    finished: int,
    received: list[list[int]],
    sent: list[list[int]],
    served: int | None,
    authenticated: bool = False,
) -> tuple[int, str]:
    """A receiver's `(status, problem)` for a version it received whole (`STATUS_OK`, "" when accepted);
    `authenticated`: the checksums are the keyed ones of a group with a secret."""
    if finished != version:
        return STATUS_PROTOCOL, f"finish {finished} after start {version}"
    if received != sent:
        where = _first_mismatch(received, sent)
        if authenticated:
            return STATUS_CHECKSUM, f"version {version}: {where} failed authentication (altered or forged); refused"
        return STATUS_CHECKSUM, f"version {version}: checksum mismatch in {where}; refused"
    if served is not None and version <= served:
        return STATUS_STALE, f"version {version} is not newer than the served {served}"
    return STATUS_OK, ""


def raise_refusal(status: int, problem: str, spec: SyncGroupSpec, rank: int, version: int) -> None:
    """Raise the error of a refused version (after its status was reported); nothing when accepted."""
    if status == STATUS_CHECKSUM:
        log.error("weights.refused", group=spec.name, rank=rank, version=version, reason=problem)
        raise ChecksumMismatch(problem)
    if status == STATUS_STALE:
        raise StaleVersion(problem)
    if status != STATUS_OK:
        raise SyncError(problem)


def hand_over(
    spec: SyncGroupSpec, rank: int, version: int, chunks: list[tuple[ChunkLayout, torch.Tensor, list[int]]]
) -> list[tuple[str, torch.Tensor]]:
    """The verified tensors of an accepted version, as views into its chunk streams, in sender order."""
    named = [pair for layout, stream, _ in chunks for pair in layout.tensors(stream)]
    total = sum(layout.total_bytes for layout, _, _ in chunks)
    log.info("weights.received", group=spec.name, rank=rank, version=version, tensors=len(named), bytes=total)
    return named


class WeightSender(SyncSender):
    """Rank 0: broadcasts each version, bucketed, with its layout first and its checksums last."""

    def __init__(
        self,
        spec: SyncGroupSpec,
        *,
        rendezvous: Rendezvous | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.spec = spec
        self.transport = GroupTransport(spec, 0, device, store=rendezvous.store if rendezvous else None)
        self.checksums = BucketChecksums(spec)
        self.last_version: int | None = None
        self._version: int | None = None
        self._checksums: list[list[int]] = []
        self._report: SyncReport | None = None
        self._started_at = 0.0
        self._staging: tuple[torch.Tensor, torch.Tensor] | None = None
        self._seq = 0

    def init(self) -> None:
        self.transport.connect()
        log.info("sync.joined", group=self.spec.name, generation=self.spec.generation, rank=0)

    def start(self, version: int) -> None:
        self.transport.ensure_usable()
        if self._version is not None:
            raise SyncError(f"version {self._version} is still open; finish() it before starting {version}")
        if self.last_version is not None and version <= self.last_version:
            raise StaleVersion(f"version {version} is not newer than the last published {self.last_version}")
        self._seq += 1
        with self.transport.guard(f"start of version {version}"):
            # The doorbell lets idle receivers wait on the store (any duration) rather than inside a collective.
            self.transport.store.set(doorbell(self._seq), str(version))
            self.transport.send_message({"kind": START, "version": version})
        self._version, self._checksums = version, []
        self._report = SyncReport(version=version)
        self._started_at = time.perf_counter()

    def update(self, named_tensors: NamedTensors) -> None:
        if self._version is None or self._report is None:
            raise SyncError("update() outside start()/finish()")
        try:
            with self.transport.guard(f"chunk {len(self._checksums)} of version {self._version}"):
                self._send_chunk(named_tensors, self._version, self._report)
        except SyncError:
            self._version = None  # the group is broken; this version is abandoned on every member
            raise
        failpoint("weights.publish")  # a chunk is out, the version not finished: receivers hold a partial one

    def abandon(self, reason: str) -> None:
        # Receivers are inside this version's message sequence: only a new generation can go on.
        self._version, self._report = None, None
        self.transport.mark_broken(reason)

    def _send_chunk(self, named_tensors: NamedTensors, version: int, report: SyncReport) -> None:
        # Tensors on another device (CPU weights bound for NCCL) are copied bucket by bucket into staging.
        named = [(name, tensor.detach()) for name, tensor in named_tensors]
        layout = ChunkLayout.plan(named, self.spec.bucket_bytes)
        previous = self._checksums[-1] if self._checksums else []
        self.transport.send_message(layout.to_message() | {"previous_checksums": previous})
        sources = [tensor_bytes(t) for _, t in named]
        staging = self._staging_buffers(min(layout.bucket_bytes, layout.total_bytes))
        checksum = self.checksums.of_chunk(version, len(self._checksums), layout)
        sums, in_flight = [], None
        # Two staging buffers: bucket k is flattened and hashed while bucket k-1 is on the wire.
        for index in range(layout.bucket_count):
            bucket = layout.fill_bucket(index, sources, staging[index % 2])
            sums.append(checksum(index, bucket))
            handle = self.transport.broadcast_async(bucket, f"bucket {index}")
            if in_flight is not None:
                self.transport.wait(in_flight)
            in_flight = handle
        if in_flight is not None:
            self.transport.wait(in_flight)
        self._checksums.append(sums)
        report.tensors += len(named)
        report.bytes += layout.total_bytes
        report.buckets += layout.bucket_count

    def _staging_buffers(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._staging is None or self._staging[0].numel() < size:
            device = self.transport.device
            self._staging = (
                torch.empty(size, dtype=torch.uint8, device=device),
                torch.empty(size, dtype=torch.uint8, device=device),
            )
        return self._staging

    def finish(self, version: int) -> SyncReport:
        if self._version != version or self._report is None:
            raise SyncError(f"finish({version}) does not match the open version {self._version}")
        try:
            with self.transport.guard(f"finish of version {version}"):
                digest = self.sent_digest()
                message = {"kind": FINISH, "version": version, "checksums": self._checksums, "digest": digest}
                self.transport.send_message(message)
                statuses = self.transport.allgather_status(STATUS_OK, version)
        except SyncError:
            self._version = None
            raise
        report = self._report
        report.seconds, report.digest = time.perf_counter() - self._started_at, digest
        report.refused = {
            rank: STATUS_NAMES.get(status, str(status))
            for rank, (status, _) in enumerate(statuses)
            if rank != 0 and status != STATUS_OK
        }
        self.last_version, self._version, self._report = version, None, None
        event = log.info if report.accepted_by_all else log.warning
        event(
            "weights.published",
            group=self.spec.name,
            version=version,
            tensors=report.tensors,
            bytes=report.bytes,
            buckets=report.buckets,
            seconds=round(report.seconds, 4),
            refused=report.refused,
        )
        return report

    def close(self) -> None:
        self.transport.close()
        self._staging = None
        self._version = None


class WeightReceiver(SyncReceiver):
    """Rank 1..N: receives a whole version, verifies every bucket's checksum, then hands it over."""

    def __init__(
        self,
        spec: SyncGroupSpec,
        rank: int,
        *,
        device: torch.device | str | None = None,
        bucket_hook: BucketHook | None = None,
        reuse_buffers: bool = False,
    ) -> None:
        """`reuse_buffers=True` receives each version into the previous version's buffers (no allocation, no
        page faults): tensors from one `receive()` are then valid only until the next. Right for engines
        that copy weights on load (vLLM `load_weights` does), wrong for callers that keep the tensors."""
        if rank == 0:
            raise ValueError("rank 0 is the trainer; explorer workers are ranks 1..N")
        self.spec, self.rank = spec, rank
        self.transport = GroupTransport(spec, rank, device)
        self.checksums = BucketChecksums(spec)
        self.version: int | None = None
        self._bucket_hook = bucket_hook  # test hook: alter received bytes to prove corruption is caught
        self._streams = StreamBuffers(self.transport.device, reuse_buffers)
        self._seq = 0

    def init(self) -> None:
        self.transport.connect()
        log.info("sync.joined", group=self.spec.name, generation=self.spec.generation, rank=self.rank)

    def receive(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        self.transport.ensure_usable()
        self._wait_for_doorbell(idle_timeout_s)
        with self.transport.guard("receive"):
            return self._receive_version()

    def _receive_version(self) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        version = self._receive_start()
        chunks: list[tuple[ChunkLayout, torch.Tensor, list[int]]] = []
        while (message := self._next_message()) is not None and message["kind"] == CHUNK:
            layout = ChunkLayout.from_message(message)
            stream = self._streams.get(len(chunks), layout.total_bytes)
            chunks.append((layout, stream, self._receive_chunk(version, len(chunks), layout, stream)))
        self._conclude(version, message, [s for _, _, s in chunks])
        return version, iter(hand_over(self.spec, self.rank, version, chunks))

    def receive_streamed(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        """The version the trainer announced, and its tensors as each chunk arrives and its checksums match.

        Holds one chunk, not the version: chunk k is verified against the checksums the sender puts in chunk
        k+1's header (the last against FINISH) and handed over before chunk k+1's buckets are received, so the
        sender waits while the consumer loads it. The iterator raises `ChecksumMismatch` at the first chunk that
        does not match, after the rest of the version was received (unloaded) and the refusal reported, so the
        group survives; what was handed over before it stays with the consumer, who must not serve it as a
        version. Abandoned part-way (`close()`), it receives the rest and reports an error status.
        """
        self.transport.ensure_usable()
        announced = self._wait_for_doorbell(idle_timeout_s)
        return announced, self._stream_version(announced)

    def _stream_version(self, announced: int) -> Iterator[tuple[str, torch.Tensor]]:
        received: list[list[int]] = []
        held: tuple[ChunkLayout, torch.Tensor] | None = None  # the chunk waiting for its checksums
        finished = False
        try:
            with self.transport.guard("streamed receive"):
                version = self._receive_start()
                if version != announced:
                    self._protocol_error(f"start of version {version} after the doorbell of {announced}")
            while True:
                with self.transport.guard("streamed receive"):
                    message = self._next_message()
                    expected = (
                        message["checksums"][-1:] if message["kind"] == FINISH else [message["previous_checksums"]]
                    )
                if held is not None:
                    if expected != received[-1:]:
                        break  # the verdict below names the chunk; nothing more is handed over
                    yield from held[0].tensors(held[1])
                    held = None
                if message["kind"] == FINISH:
                    finished = True  # judged here, accepted or refused
                    with self.transport.guard("streamed receive"):
                        self._conclude(version, message, received)
                    return
                layout = ChunkLayout.from_message(message)
                stream = torch.empty(layout.total_bytes, dtype=torch.uint8, device=self.transport.device)
                with self.transport.guard("streamed receive"):
                    received.append(self._receive_chunk(version, len(received), layout, stream))
                held = (layout, stream)
            finished = True  # a chunk failed its checksums: the rest is received unloaded and the version refused
            with self.transport.guard("streamed receive"):
                self._drain(version, message, received)
        finally:
            if not finished and self.transport.broken is None:  # abandoned by the consumer: finish unloaded
                with self.transport.guard("streamed receive, abandoned by the engine"):
                    self._drain(version, message, received, STATUS_PROTOCOL)

    def _drain(
        self, version: int, message: dict[str, Any], received: list[list[int]], status: int | None = None
    ) -> None:
        """Receive the rest of `version` without handing it over, from `message` (received, not yet acted on),
        then report (`status`, else the verdict) and raise its refusal."""
        while message["kind"] == CHUNK:
            layout = ChunkLayout.from_message(message)
            stream = torch.empty(layout.total_bytes, dtype=torch.uint8, device=self.transport.device)
            received.append(self._receive_chunk(version, len(received), layout, stream))
            message = self._next_message()
        self._conclude(version, message, received, status)

    def _receive_start(self) -> int:
        start = self.transport.recv_message()
        if start.get("kind") != START:
            self._protocol_error(f"expected {START}, got {start.get('kind')}")
        return int(start["version"])

    def _next_message(self) -> dict[str, Any]:
        message = self.transport.recv_message()
        if message["kind"] not in (CHUNK, FINISH):
            self._protocol_error(f"unexpected message {message['kind']}")
        return message

    def _receive_chunk(self, version: int, index: int, layout: ChunkLayout, stream: torch.Tensor) -> list[int]:
        """Receive chunk `index`'s buckets into `stream`; returns their checksums."""
        checksum = self.checksums.of_chunk(version, index, layout)
        sums: list[int] = []
        # Bucket k+1 is already being received while bucket k is hashed.
        handles = [
            self.transport.broadcast_async(stream[slice(*layout.bucket_range(i))], f"bucket {i}")
            for i in range(min(2, layout.bucket_count))
        ]
        for bucket_index in range(layout.bucket_count):
            self.transport.wait(handles[bucket_index])
            if bucket_index + 2 <= layout.bucket_count - 1:
                nxt = bucket_index + 2
                handles.append(
                    self.transport.broadcast_async(stream[slice(*layout.bucket_range(nxt))], f"bucket {nxt}")
                )
            bucket = stream[slice(*layout.bucket_range(bucket_index))]
            if self._bucket_hook is not None:
                self._bucket_hook(index, bucket_index, bucket)
            sums.append(checksum(bucket_index, bucket))
        return sums

    def _conclude(
        self, version: int, finish: dict[str, Any], received: list[list[int]], status: int | None = None
    ) -> None:
        """Judge the version by its FINISH message, report to every member, raise a refusal; record an accepted one.
        `status`: report this instead of the verdict (an update abandoned by the engine)."""
        verdict_status, problem = verdict(
            version, int(finish["version"]), received, finish["checksums"], self.version, self.checksums.authenticated
        )
        if status is not None and verdict_status == STATUS_OK:
            verdict_status, problem = status, f"version {version}: the engine stopped loading it part-way"
        # Report before raising, so every member completes the same message sequence and the group survives.
        self.transport.allgather_status(verdict_status, version)
        raise_refusal(verdict_status, problem, self.spec, self.rank, version)
        self.version, self.published_digest = version, finish.get("digest")

    def _wait_for_doorbell(self, idle_timeout_s: float | None) -> int:
        """Wait for the next update to begin; returns the version it announces."""
        self._seq += 1
        try:
            wait_for_doorbell(self.transport.store, self._seq, self.spec, idle_timeout_s)
        except NoUpdateYet:
            self._seq -= 1  # nothing was consumed: the next receive() waits for the same update
            raise
        return int(self.transport.store.get(doorbell(self._seq)))

    def _protocol_error(self, problem: str) -> NoReturn:
        self.transport.mark_broken(problem)
        raise SyncError(f"sync protocol error on rank {self.rank}: {problem}; re-form the group")

    def close(self) -> None:
        self.transport.close()
        self._streams.clear()


def _first_mismatch(received: list[list[int]], sent: list[list[int]]) -> str:
    if len(received) != len(sent):
        return f"chunk count ({len(received)} received, {len(sent)} sent)"
    for c, (mine, theirs) in enumerate(zip(received, sent, strict=True)):
        for b, (x, y) in enumerate(zip(mine, theirs, strict=False)):
            if x != y:
                return f"chunk {c} bucket {b}"
        if len(mine) != len(theirs):
            return f"chunk {c} bucket count"
    return "unknown"


register_sync_backend("gloo", WeightSender, WeightReceiver)
register_sync_backend("nccl", WeightSender, WeightReceiver)
