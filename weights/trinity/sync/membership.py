"""Who may be in a process group: every member proves it holds the group's secret before anything is trusted.

torch's TCPStore has no authentication: whoever reaches its port can list, read and write every key, among them
the addresses the members of a forming process group publish for each other. With a secret from the gateway
(one per weight-sync generation, one per trainer run; docs/security.md, "Process groups"):

- `SignedStore` puts an HMAC of the key and the bytes on every value a member writes, and refuses on read a value
  without a valid one. Nobody without the secret can point a member at itself by rewriting an address, so nobody
  can sit between two members and relay their traffic.
- `prove_membership`, once the group's connections exist: every rank sends a fresh nonce, then an HMAC of all the
  nonces and its own rank, and checks every other rank's. A process that took a member's place by connecting first
  to its published address cannot answer. Nothing travels in the group before this passed: not weights, not the
  trainer ranks' pickled commands.

A stranger can still keep a group from forming (connect first, overwrite keys, fill the store); it cannot join it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

NONCE_BYTES = 32
_SIGNED = struct.Struct(">8si32s")  # marker, the writer's rank, HMAC-SHA256; then the value
_MARKER = b"trinity1"
_RANK = struct.Struct(">i")

Exchange = Callable[[bytes], list[bytes]]
"""An allgather of equal-sized byte strings over the group: every rank's, indexed by rank."""


def derive(secret: bytes, purpose: str) -> bytes:
    """A key of its own for each use of a secret (store values, proofs, weight checksums): no MAC made for one use
    verifies in another."""
    return hmac.new(secret, f"trinity/{purpose}".encode(), hashlib.sha256).digest()


def framed(*parts: bytes) -> bytes:
    """`parts` joined unambiguously (each after its length), for MACs over several fields."""
    return b"".join(struct.pack(">Q", len(part)) + part for part in parts)


class MembershipRefused(RuntimeError):
    """A process in a forming group does not hold its secret; `ranks`: the ranks refused (empty when unknown)."""

    def __init__(self, group: str, ranks: Sequence[int], problem: str) -> None:
        self.ranks = sorted(set(ranks))
        super().__init__(
            f"{group}: {problem}; refused: a member must hold the group's secret, which the gateway hands to callers "
            "with the deployment's token (TRINITY_AUTH_TOKEN)"
        )


class SignedStore(dist.Store):
    """`inner` with an HMAC (of the group, the key, the writer's rank and the bytes) on every value set through it,
    checked on every get. Counters (`add`) and key checks carry no value to sign: they pass through."""

    def __init__(self, inner: dist.Store, secret: bytes, group: str, rank: int) -> None:
        super().__init__()
        self._inner, self._group, self._rank = inner, group, rank
        self._key = derive(secret, "store")

    def _tag(self, key: str, rank: int, data: bytes) -> bytes:
        signed = framed(self._group.encode(), key.encode(), _RANK.pack(rank), data)
        return hmac.new(self._key, signed, hashlib.sha256).digest()

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        header = _SIGNED.pack(_MARKER, self._rank, self._tag(key, self._rank, data))
        self._inner.set(key, header + data)  # type: ignore[arg-type]  # bytes travel as they are

    def get(self, key: str) -> bytes:
        raw = bytes(self._inner.get(key))
        if len(raw) < _SIGNED.size or not raw.startswith(_MARKER):
            raise MembershipRefused(self._group, [], f"store key {key!r} holds a value not signed with the secret")
        _, claimed, tag = _SIGNED.unpack_from(raw)
        data = raw[_SIGNED.size :]
        if not hmac.compare_digest(tag, self._tag(key, claimed, data)):
            problem = f"store key {key!r} holds a value, claiming rank {claimed}, that fails authentication"
            raise MembershipRefused(self._group, [claimed], problem)
        return data

    def add(self, key: str, value: int) -> int:
        return self._inner.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)


def prove_membership(exchange: Exchange, secret: bytes, group: str, rank: int) -> None:
    """Every rank proves it holds `secret`, over the group's own connections; `MembershipRefused` naming every rank
    whose proof fails (each member raises it, so none goes on with a stranger)."""
    nonces = exchange(secrets.token_bytes(NONCE_BYTES))
    transcript = framed(group.encode(), *nonces)
    key = derive(secret, "proof")

    def proof(r: int) -> bytes:
        return hmac.new(key, transcript + _RANK.pack(r), hashlib.sha256).digest()

    proofs = exchange(proof(rank))
    if failed := [r for r, p in enumerate(proofs) if r != rank and not hmac.compare_digest(p, proof(r))]:
        raise MembershipRefused(group, failed, f"rank(s) {failed} failed the membership proof")


def allgather_exchange(group: Any, world_size: int, device: torch.device, timeout: timedelta) -> Exchange:
    """An `Exchange` over a process group (gloo or NCCL, registered or not); each allgather bounded by `timeout`."""

    def exchange(data: bytes) -> list[bytes]:
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        out = [torch.empty_like(mine) for _ in range(world_size)]
        group.allgather([out], [mine]).wait(timeout)
        return [bytes(t.cpu().numpy()) for t in out]

    return exchange
