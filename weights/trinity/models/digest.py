"""A digest of a set of named tensors: equal digests mean the same names, dtypes, shapes and bytes.

Computed one tensor at a time, in any order (`WeightsDigest`), so a trainer can digest the weights in the
same single pass that streams them to explorers, holding nothing but one 64-bit hash per tensor: each
tensor is hashed on its own (name, dtype, shape, bytes), then the per-tensor hashes are hashed in name
order. The explorer digests the tensors it received the same way; equal weights give equal digests
whatever order either side saw them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

DIGEST_BITS = 52  # fits a float64 exactly, so it can travel as a run-event metric


class WeightsDigest:
    """Feed tensors with `add` (or pass a stream through `observe`); read `value` at the end."""

    def __init__(self) -> None:
        self._entries: list[tuple[str, int]] = []

    def add(self, name: str, tensor: Any) -> None:
        import torch
        import xxhash

        flat = tensor.detach().to("cpu").contiguous()
        hasher = xxhash.xxh3_64()
        hasher.update(f"{name}|{flat.dtype}|{tuple(flat.shape)}".encode())
        hasher.update(flat.reshape(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
        self._entries.append((name, hasher.intdigest()))

    def observe(self, named_tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """The same stream, digested as it passes (the caller's single iteration does both)."""
        for name, tensor in named_tensors:
            self.add(name, tensor)
            yield name, tensor

    @property
    def value(self) -> int:
        import xxhash

        hasher = xxhash.xxh3_64()
        for name, tensor_hash in sorted(self._entries):
            hasher.update(f"{name}|{tensor_hash:016x}\n".encode())
        return hasher.intdigest() & ((1 << DIGEST_BITS) - 1)


def weights_digest(named_tensors: Iterable[tuple[str, Any]]) -> int:
    digest = WeightsDigest()
    for name, tensor in named_tensors:
        digest.add(name, tensor)
    return digest.value
