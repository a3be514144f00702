"""Checksums of byte buffers, by name (the spec's `checksum` field picks one), and of a version's buckets.

Default `xxh3_64`: a 64-bit non-cryptographic hash at ~39 GB/s on one core here (crc32 ~6.7 GB/s,
a float64 sum ~1.2 GB/s). Unlike a sum it changes when bytes are reordered (a transposed or swapped
tensor) and when compensating changes cancel out; it is cheap enough that a 538 MB model costs ~14 ms
per side. It guards against software bugs and memory corruption, not against an adversary: a group with a
secret (a deployment with a token) uses an authenticated checksum instead (`BucketChecksums`).
"""

from __future__ import annotations

import hmac
import json
import zlib
from collections.abc import Callable

import torch

from trinity.registry import Registry
from trinity.sync.membership import derive, framed
from trinity.sync.protocol import ChunkLayout
from trinity.sync.spec import SyncGroupSpec

Checksum = Callable[[memoryview], int]
CHECKSUMS: Registry[Checksum] = Registry("checksum")
register_checksum = CHECKSUMS.register
MAC_BYTES = 16  # of an authenticated bucket checksum (HMAC-SHA256, truncated)


@register_checksum("xxh3_64")
def _xxh3_64(data: memoryview) -> int:
    import xxhash

    return int(xxhash.xxh3_64_intdigest(data))


@register_checksum("crc32")
def _crc32(data: memoryview) -> int:
    return zlib.crc32(data)


def host_bytes(buffer: torch.Tensor) -> memoryview:
    """The bytes of a 1-D uint8 tensor `[nbytes]`; a device tensor is copied to host first."""
    host = buffer if buffer.device.type == "cpu" else buffer.cpu()
    return host.contiguous().numpy().data


def checksum_bytes(name: str, buffer: torch.Tensor) -> int:
    """Checksum `name` of a 1-D uint8 tensor `[nbytes]`."""
    return CHECKSUMS.get(name)(host_bytes(buffer))


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor as a flat uint8 view `[numel * itemsize]` (a copy only if not contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8)


BucketChecksum = Callable[[int, torch.Tensor], int]
"""`checksum(bucket_index, bucket_bytes)` of one chunk's buckets."""


class BucketChecksums:
    """The checksum of each bucket of a version, the same on the sender and every receiver.

    Without a secret: `spec.checksum` of the bytes, as always. With the generation's secret: HMAC-SHA256 (the first
    `MAC_BYTES` kept) keyed with a key derived from it, of the bytes and of where they belong (generation, version,
    chunk, the chunk's layout, bucket index). Nobody without the secret can make one, so a bucket altered on the wire
    or forged fails it, and so does one moved to another place or version, or a tampered layout. HMAC-SHA256 rather
    than keyed BLAKE2b: with the CPU's SHA extensions it is the faster here (docs/weight-sync.md, "Measured").
    """

    def __init__(self, spec: SyncGroupSpec) -> None:
        secret = spec.secret_bytes
        self.authenticated = secret is not None
        self._plain = CHECKSUMS.get(spec.checksum)
        self._key = derive(secret, "weights") if secret is not None else b""
        self._group = spec.store_prefix.encode()

    def of_chunk(self, version: int, index: int, layout: ChunkLayout) -> BucketChecksum:
        """The checksum of the buckets of chunk `index` of `version`, laid out as `layout`."""
        if not self.authenticated:
            return lambda _, bucket: self._plain(host_bytes(bucket))
        where = [str(version).encode(), str(index).encode(), json.dumps(layout.to_message()).encode()]
        place = framed(self._group, *where)

        def mac(bucket_index: int, bucket: torch.Tensor) -> int:
            keyed = hmac.new(self._key, framed(place, str(bucket_index).encode()), "sha256")
            keyed.update(host_bytes(bucket))
            return int.from_bytes(keyed.digest()[:MAC_BYTES], "big")

        return mac
