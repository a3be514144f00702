"""The named interface every sync backend implements, and the registry that picks one by `spec.backend`.

Trainer side:   init() -> start(version) -> update(named_tensors)* -> finish(version) -> close()
Explorer side:  init() -> receive() / receive_streamed() / receive_into(load_fn) ... -> close()
"""

from __future__ import annotations

import contextlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from trinity.models.digest import WeightsDigest
from trinity.registry import Registry
from trinity.sync.protocol import chunks_of, group_by_layer
from trinity.sync.spec import SyncGroupSpec

NamedTensors = Iterable[tuple[str, torch.Tensor]]
LoadFn = Callable[[int, list[tuple[str, torch.Tensor]]], Any]
"""`load_fn(version, named_tensors)`: what the engine does with verified weights (e.g. vLLM `load_weights`)."""


@dataclass
class SyncReport:
    """What the trainer learns from one published version."""

    version: int
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    refused: dict[int, str] = field(default_factory=dict)
    """rank -> reason, for members that received the update but did not accept it."""
    digest: int | None = None
    """`trinity.models.digest` of every tensor `publish` sent (it travels to the receivers with the version)."""

    @property
    def accepted_by_all(self) -> bool:
        return not self.refused


class SyncSender(ABC):
    """Trainer side of a weight update."""

    spec: SyncGroupSpec
    _digest: WeightsDigest | None = None  # of the version `publish` is sending

    @abstractmethod
    def init(self) -> None:
        """Join the group (or prepare the shared directory)."""

    @abstractmethod
    def start(self, version: int) -> None:
        """Begin version `version`; it must be newer than the last one published."""

    @abstractmethod
    def update(self, named_tensors: NamedTensors) -> None:
        """Send one chunk of Hugging-Face-named tensors; may be called many times per version.

        The chunk is held whole while it is sent: keep it about `spec.bucket_bytes` (`publish` does)."""

    @abstractmethod
    def finish(self, version: int) -> SyncReport:
        """End the version; returns which members refused it."""

    @abstractmethod
    def close(self) -> None:
        """Leave the group; a new sender with a new spec generation may be created afterwards."""

    @abstractmethod
    def abandon(self, reason: str) -> None:
        """Drop the open version after a failure mid-update; the next `start` begins afresh, or raises
        `SyncError` when the group can no longer be used (receivers were left mid-version)."""

    def publish(self, version: int, named_tensors: NamedTensors) -> SyncReport:
        """`start`, one `update` per bucket-sized chunk, `finish`: holds one chunk at a time (gather a bucket,
        send it, free it) and iterates `named_tensors` exactly once, to the end even when the update fails:
        on a sharded trainer the other ranks are gathering the same tensors, and their collectives must match.
        The tensors are digested as they pass; `finish` sends the digest with the version (`sent_digest`)."""
        self._digest = WeightsDigest()
        source = iter(self._digest.observe(named_tensors))
        try:
            self.start(version)
            try:
                for chunk in chunks_of(source, self.spec.bucket_bytes):
                    self.update(chunk)
                    del chunk  # the loop variable would keep the sent chunk alive while the next is gathered
            except Exception as err:
                # The source (a gather on the trainer's own group) or the transport failed between start
                # and finish: receivers are mid-version, so this version is over on every member.
                self.abandon(f"version {version} abandoned mid-update: {err!r}")
                raise
            return self.finish(version)
        finally:
            for _ in source:  # nothing left after a complete update; a generator that raised is exhausted
                pass
            self._digest = None

    def sent_digest(self) -> int | None:
        """For `finish`: the digest of every tensor `publish` sent of this version; None for an update made by
        `start`/`update`/`finish` directly (receivers then have no digest to compare with)."""
        return self._digest.value if self._digest is not None else None

    def __enter__(self) -> SyncSender:
        self.init()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncReceiver(ABC):
    """Explorer side of a weight update. Nothing reaches the engine before every checksum matched."""

    spec: SyncGroupSpec
    version: int | None
    published_digest: int | None = None
    """The sender's digest of the version `receive` returned last (None when it sent none): a receiver that digests
    what it loads (`trinity.models.digest`) compares the two."""

    @abstractmethod
    def init(self) -> None: ...

    @abstractmethod
    def receive(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        """Block until the next version arrives (at most `idle_timeout_s`, default `spec.timeout_s`),
        verify it, and return `(version, named_tensors)` in the sender's order."""

    @abstractmethod
    def close(self) -> None: ...

    def receive_streamed(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        """Like `receive`, for a consumer that loads as tensors arrive: a backend that can verify part of a version
        (the collective one: a chunk at a time) hands each part over once verified and holds no more than it;
        this default receives and verifies the whole version first. Finish the iterator with `finish_stream`."""
        return self.receive(idle_timeout_s)

    def receive_into(
        self, load_fn: LoadFn, group_by: Literal["layer", "all"] = "layer", idle_timeout_s: float | None = None
    ) -> int:
        """Receive and verify one version, then hand it to `load_fn(version, named_tensors)`.

        `group_by="layer"`: one call per decoder layer (every `model.layers.N.` tensor in the same call) and
        one per tensor outside the layers; `"all"`: a single call with every tensor. Returns the version.
        """
        version, named = self.receive(idle_timeout_s)
        if group_by == "all":
            load_fn(version, list(named))
        else:
            for group in group_by_layer(named):
                load_fn(version, group)
        return version

    def __enter__(self) -> SyncReceiver:
        self.init()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finish_stream(named: Iterator[tuple[str, torch.Tensor]]) -> None:
    """After the consumer of `receive_streamed` stopped, for any reason: an update it left part-way (or never
    began) is received to its end unloaded and reported as an error, so the group goes on (raises `SyncError`)."""
    if not isinstance(named, Generator):
        return  # received whole: nothing is pending on the group
    if inspect.getgeneratorstate(named) == inspect.GEN_CREATED:
        next(named, None)  # a generator that never ran cannot clean up on close: run it to its first tensor
    named.close()


def load_streamed(
    version: int,
    named: Iterator[tuple[str, torch.Tensor]],
    load: Callable[[int, Iterator[tuple[str, torch.Tensor]]], Any],
) -> int:
    """`load(version, named)` of a `receive_streamed` version, digested as it passes; returns the digest of what was
    handed over (compare it with `receiver.published_digest`). However `load` ends, the update is finished
    (`finish_stream`); when `load` raised, its error is the one that leaves, not the group's report of it."""
    digest = WeightsDigest()
    try:
        load(version, digest.observe(named))
    except BaseException:
        from trinity.sync.errors import SyncError

        with contextlib.suppress(SyncError):
            finish_stream(named)
        raise
    finish_stream(named)  # nothing left when `load` read to the end; what it left unread is reported as an error
    return digest.value


@dataclass(frozen=True)
class SyncBackend:
    """One backend's two sides: `sender(spec, **options)` and `receiver(spec, rank, **options)`."""

    sender: Callable[..., SyncSender]
    receiver: Callable[..., SyncReceiver]


# Each backend's module is imported the first time a spec names it.
BACKENDS: Registry[SyncBackend] = Registry("sync_backend")


def register_sync_backend(name: str, sender: Callable[..., SyncSender], receiver: Callable[..., SyncReceiver]) -> None:
    BACKENDS.register(name)(SyncBackend(sender, receiver))


def open_sender(spec: SyncGroupSpec, **options: Any) -> SyncSender:
    """The trainer-side implementation for `spec.backend` (not yet initialized)."""
    return BACKENDS.get(spec.backend).sender(spec, **options)


def open_receiver(spec: SyncGroupSpec, rank: int, **options: Any) -> SyncReceiver:
    """The explorer-side implementation for `spec.backend` (not yet initialized)."""
    return BACKENDS.get(spec.backend).receiver(spec, rank, **options)
