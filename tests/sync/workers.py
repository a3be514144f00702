"""Explorer-side processes for the sync tests (spawned; each joins the group as one receiver rank)."""

from __future__ import annotations

import io
import json
import os
import signal
import time
import traceback
import weakref
from multiprocessing.queues import Queue
from typing import Any

import torch

from trinity.sync import ChecksumMismatch, SyncError, SyncGroupSpec, SyncReceiver, finish_stream, open_receiver
from trinity.sync.checksum import checksum_bytes, tensor_bytes


def pack(named: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save({n: t.clone() for n, t in named.items()}, buffer)
    return buffer.getvalue()


def unpack(data: bytes) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(data))  # type: ignore[no-any-return]


def _flip_first_byte(chunk: int, bucket: int, data: torch.Tensor) -> None:
    if chunk == 0 and bucket == 0:
        data[0] ^= 0xFF


def _die_at_second_bucket(chunk: int, bucket: int, data: torch.Tensor) -> None:
    if bucket == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _flip_second_chunk(chunk: int, bucket: int, data: torch.Tensor) -> None:
    if chunk == 1 and bucket == 0:
        data[0] ^= 0xFF


HOOKS = {
    "corrupt": _flip_first_byte,
    "die": _die_at_second_bucket,
    "stream_corrupt": _flip_second_chunk,
}


def stream_version(receiver: SyncReceiver, step: str, got: dict[str, torch.Tensor]) -> tuple[int, int]:
    """`receive_streamed` as an engine consumes it: each tensor copied into `got` and dropped at once. Returns the
    version and the most chunk buffers alive at any tensor (weak references: what the receiver still holds).
    "stream_abandon" stops after the first tensor, as an engine that failed would."""
    version, named_iter = receiver.receive_streamed(idle_timeout_s=60)
    alive: list[weakref.ref[torch.UntypedStorage]] = []
    most_alive = 0
    try:
        for name, tensor in named_iter:
            storage = tensor.untyped_storage()
            alive = [ref for ref in alive if ref() is not None and ref() is not storage] + [weakref.ref(storage)]
            most_alive = max(most_alive, len(alive))
            got[name] = tensor.clone()
            del tensor, storage
            if step == "stream_abandon":
                break
    finally:
        finish_stream(named_iter)
    return version, most_alive


def receiver_main(
    spec_json: str, rank: int, plan: list[str], results: Queue, control: Queue | None, secret: bytes | None = None
) -> None:
    """Run `plan`, one step per expected update: "ok", "corrupt" (first bucket flipped), "die", "fail_then_rejoin",
    and streamed: "stream", "stream_corrupt" (the second chunk's first bucket flipped), "stream_abandon".

    Reports `(rank, step, outcome, version, packed tensors, checksums)` per step on `results`. `secret`: the
    group's, as the gateway hands it out (a JSON spec never carries it).
    """
    torch.set_num_threads(1)
    spec = SyncGroupSpec.model_validate({**json.loads(spec_json), "secret": secret})
    receiver: SyncReceiver | None = None
    try:
        for step in plan:
            if receiver is None:
                hook = HOOKS.get(step)
                # Even ranks reuse their buffers across versions, odd ranks allocate: both paths get exercised.
                # CPU tensors: gloo, or cuda_ipc through host shared memory standing in for GPU memory.
                receiver = open_receiver(spec, rank, device="cpu", bucket_hook=hook, reuse_buffers=rank % 2 == 0)
                receiver.init()
            try:
                started = time.monotonic()
                extra: dict[str, Any] = {}
                named: dict[str, torch.Tensor] = {}
                if step.startswith("stream"):
                    version, extra["most_chunks_alive"] = stream_version(receiver, step, named)
                else:
                    version, named_iter = receiver.receive(idle_timeout_s=60)
                    named = dict(named_iter)
                sums = {n: checksum_bytes("xxh3_64", tensor_bytes(t)) for n, t in named.items()}
                results.put((rank, step, "ok", version, pack(named), sums | extra))
            except ChecksumMismatch as err:
                results.put((rank, step, "checksum_mismatch", None, b"", {"error": str(err), "handed": list(named)}))
                # The group survives a refused version; corrupt only the first.
                receiver._bucket_hook = None  # type: ignore[attr-defined]
            except SyncError as err:
                if step == "stream_abandon":  # reported to the group as an error; the group goes on
                    results.put((rank, step, "abandoned", None, b"", {"error": str(err), "handed": list(named)}))
                    continue
                elapsed = time.monotonic() - started
                results.put((rank, step, "sync_error", None, b"", {"error": str(err), "seconds": elapsed}))
                receiver.close()
                receiver = None
                if step == "fail_then_rejoin" and control is not None:
                    spec_json, rank = control.get(timeout=60)
                    spec = SyncGroupSpec.model_validate_json(spec_json)
    except Exception:  # noqa: BLE001 - the worker reports any failure to the test
        results.put((rank, "crash", traceback.format_exc(), None, b"", {}))
    finally:
        if receiver is not None:
            receiver.close()


def results_by_rank(results: Queue, count: int, timeout: float = 60) -> dict[int, list[tuple[Any, ...]]]:
    out: dict[int, list[tuple[Any, ...]]] = {}
    for _ in range(count):
        item = results.get(timeout=timeout)
        if item[1] == "crash":
            raise AssertionError(f"receiver rank {item[0]} crashed:\n{item[2]}")
        out.setdefault(item[0], []).append(item)
    return out
