"""The wire protocol of a collective weight update: message kinds, tensor layout, bucket ranges.

Message order on the group (rank 0 broadcasts, every other rank receives):

    START {version}
    ( CHUNK {names, dtypes, shapes, offsets, total_bytes, bucket_bytes, previous_checksums}  bucket_0 .. bucket_k-1 )*
    FINISH {version, checksums per chunk per bucket}
    allgather(status)            every member reports accept/refuse; rank 0 learns who serves the version

One CHUNK per `update()` call; `SyncSender.publish` cuts the weights into chunks of at most `bucket_bytes`
(`chunks_of`), so a trainer holds about one bucket of them at a time. Inside a chunk, tensors are laid out
back to back in one byte stream (each at a 64-byte aligned offset, so a receiver can view any dtype in
place), and the stream is cut into buckets of `bucket_bytes`: a bucket may hold many small tensors or a
slice of a large one (a tensor larger than a bucket is a chunk of its own).

Each CHUNK also carries the checksums of the chunk before it (FINISH carries the last chunk's among all of
them), so a receiver that streams into its engine can verify a chunk before loading it while holding no more
than that chunk: it never waits for FINISH to learn what it should have received.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64
START, CHUNK, FINISH = "start", "chunk", "finish"
STATUS_OK, STATUS_CHECKSUM, STATUS_STALE, STATUS_PROTOCOL = 0, 1, 2, 3
STATUS_NAMES = {STATUS_OK: "ok", STATUS_CHECKSUM: "checksum_mismatch", STATUS_STALE: "stale", STATUS_PROTOCOL: "error"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in weight metadata")
    return dtype


def padded_size(tensor: torch.Tensor) -> int:
    """Bytes a tensor takes in a chunk's stream (its size rounded up to `ALIGN`)."""
    return -(-(tensor.numel() * tensor.element_size()) // ALIGN) * ALIGN


def narrowed_to(named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with each floating tensor at least as wide as `dtype` cast to it, one tensor at a time.

    The explorer's engine holds its weights in `dtype` and casts what it receives to it anyway, so casting
    before the wire sends only the bytes it keeps (half of fp32 for bf16) and loses nothing it would. Narrower
    floating tensors (bf16 weights bound for an fp32 engine) and integer tensors pass as they are: widening
    them would add bytes and no information, and the engine widens on load exactly.
    """
    width = torch.empty((), dtype=dtype).element_size()
    for name, tensor in named:
        if tensor.is_floating_point() and tensor.dtype != dtype and tensor.element_size() >= width:
            tensor = tensor.to(dtype)
        yield name, tensor


def chunks_of(named: Iterable[tuple[str, torch.Tensor]], target_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most `target_bytes` of stream (a larger tensor is a group of its own).

    Iterates `named` once and holds one group at a time: from a sharded trainer each tensor is freshly
    gathered, so a publish holds about one bucket of gathered weights, never the whole model.
    """
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = padded_size(tensor)
        if chunk and size + nbytes > target_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk


@dataclass(frozen=True)
class ChunkLayout:
    """Where each tensor of one chunk lives in the chunk's byte stream, and how the stream is bucketed."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    offsets: list[int]
    nbytes: list[int]
    total_bytes: int
    bucket_bytes: int

    @property
    def bucket_count(self) -> int:
        return -(-self.total_bytes // self.bucket_bytes) if self.total_bytes else 0

    def bucket_range(self, index: int) -> tuple[int, int]:
        start = index * self.bucket_bytes
        return start, min(start + self.bucket_bytes, self.total_bytes)

    def to_message(self) -> dict[str, Any]:
        return {"kind": CHUNK, **self.__dict__}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ChunkLayout:
        """The layout of a CHUNK message (whatever else the message carries)."""
        return cls(**{k: message[k] for k in cls.__dataclass_fields__})

    @classmethod
    def plan(cls, named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> ChunkLayout:
        offsets, nbytes, cursor = [], [], 0
        for _, tensor in named:
            size = tensor.numel() * tensor.element_size()
            offsets.append(cursor)
            nbytes.append(size)
            cursor += padded_size(tensor)
        return cls(
            names=[n for n, _ in named],
            dtypes=[dtype_name(t.dtype) for _, t in named],
            shapes=[list(t.shape) for _, t in named],
            offsets=offsets,
            nbytes=nbytes,
            total_bytes=cursor,
            bucket_bytes=bucket_bytes,
        )

    def tensors(self, stream: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """Views into a received chunk stream `[total_bytes]` uint8, in sender order (no copies)."""
        out = []
        for name, dtype, shape, offset, size in zip(
            self.names, self.dtypes, self.shapes, self.offsets, self.nbytes, strict=True
        ):
            view = stream[offset : offset + size].view(dtype_from_name(dtype)).reshape(shape)
            out.append((name, view))
        return out

    def fill_bucket(self, index: int, sources: list[torch.Tensor], staging: torch.Tensor) -> torch.Tensor:
        """The bytes of bucket `index` as one contiguous uint8 tensor, ready to broadcast.

        `sources` are the tensors' flat byte views. A bucket that lies inside one tensor on the staging
        device is that tensor's bytes (no copy); otherwise the overlapping pieces are copied into `staging`
        (across devices when a source lives elsewhere, e.g. CPU weights bound for an NCCL group) and gaps
        are zeroed.
        """
        start, end = self.bucket_range(index)
        for offset, size, src in zip(self.offsets, self.nbytes, sources, strict=True):
            if offset <= start and end <= offset + size and src.device == staging.device:
                return src[start - offset : end - offset]
        out = staging[: end - start]
        cursor = start
        for offset, size, src in zip(self.offsets, self.nbytes, sources, strict=True):
            lo, hi = max(start, offset), min(end, offset + size)
            if lo >= hi:
                continue
            if lo > cursor:
                out[cursor - start : lo - start].zero_()
            out[lo - start : hi - start].copy_(src[lo - offset : hi - offset])
            cursor = hi
        if cursor < end:
            out[cursor - start :].zero_()
        return out


def encode_message(message: dict[str, Any], device: torch.device) -> torch.Tensor:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)


def decode_message(payload: torch.Tensor) -> dict[str, Any]:
    message = json.loads(bytes(payload.cpu().numpy()))
    if not isinstance(message, dict) or "kind" not in message:
        raise ValueError(f"malformed sync message: {str(message)[:200]}")
    return message


_LAYER = re.compile(r"^(.*?\.layers\.\d+\.)")


def layer_key(name: str) -> str:
    """`model.layers.3.self_attn.q_proj.weight` -> `model.layers.3.`; tensors outside a layer -> their own name."""
    match = _LAYER.match(name)
    return match.group(1) if match else name


def group_by_layer(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups that never split a decoder layer, in order of first appearance.

    vLLM's `load_weights` stacks q/k/v and gate/up per layer: every tensor of a layer must arrive in one
    call. Tensors outside a layer (embeddings, final norm, lm_head) each form their own group.
    """
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in named:
        groups.setdefault(layer_key(name), []).append((name, tensor))
    yield from groups.values()
