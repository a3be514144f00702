"""A digest of a set of named tensors: equal digests mean the same names, dtypes, shapes and bytes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DIGEST_BITS = 52  # fits a float64 exactly, so it can travel as a run-event metric


def weights_digest(named_tensors: Iterable[tuple[str, Any]]) -> int:
    import torch
    import xxhash

    hasher = xxhash.xxh3_64()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        flat = tensor.detach().to("cpu").contiguous()
        hasher.update(f"{name}|{flat.dtype}|{tuple(flat.shape)}".encode())
        hasher.update(flat.reshape(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    return hasher.intdigest() & ((1 << DIGEST_BITS) - 1)
