"""A publish streams bucket by bucket: one pass over the weights, about one bucket held, digest in the same pass.

From a sharded trainer every tensor of `named_weights()` is freshly gathered, so the sender must drop each
chunk once sent. The senders run for real (a gloo group and a cuda_ipc group of one member, a checkpoint
directory); the source is a generator that yields fresh tensors and counts how many are still alive.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trinity.models.digest import WeightsDigest, weights_digest
from trinity.sync import SyncError, SyncGroupSpec, SyncSender, open_sender, reserve_rendezvous
from trinity.sync.checkpoint import version_dir
from trinity.sync.protocol import chunks_of, padded_size

TENSOR_BYTES, BUCKET_BYTES, TENSORS = 4096, 16384, 24


class GatheredWeights:
    """Yields `TENSORS` fresh fp32 tensors (as an FSDP2 gather would) and records the bytes alive at each yield."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.passes = 0
        self.yielded = 0
        self.peak_alive_bytes = 0
        self._alive: list[weakref.ref[torch.UntypedStorage]] = []  # memory, whichever tensor object views it

    def __call__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.passes += 1
        g = torch.Generator().manual_seed(self.seed)
        for i in range(TENSORS):
            tensor = torch.randn(TENSOR_BYTES // 4, generator=g)
            self._alive = [ref for ref in self._alive if ref() is not None]
            self.peak_alive_bytes = max(self.peak_alive_bytes, (len(self._alive) + 1) * TENSOR_BYTES)
            self._alive.append(weakref.ref(tensor.untyped_storage()))
            self.yielded += 1
            yield f"model.layers.{i}.mlp.weight", tensor
            del tensor


def _sender(backend: str, tmp_path: Path) -> SyncSender:
    spec = SyncGroupSpec.for_members(
        f"t{uuid.uuid4().hex[:8]}",
        0,
        [],  # world size 1: the sender's own memory is what is measured
        backend=backend,
        bucket_mb=BUCKET_BYTES / 2**20,
        timeout_s=10,
        checkpoint_dir=str(tmp_path),
    )
    if backend == "checkpoint":
        sender = open_sender(spec)
    else:
        rendezvous = reserve_rendezvous(spec)
        sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    return sender


@pytest.mark.parametrize("backend", ["gloo", "cuda_ipc", "checkpoint"])
def test_a_publish_iterates_the_weights_once_and_holds_about_one_bucket(backend: str, tmp_path: Path) -> None:
    weights = GatheredWeights()
    sender = _sender(backend, tmp_path)
    report = sender.publish(1, weights())
    sender.close()

    assert (weights.passes, weights.yielded, report.tensors) == (1, TENSORS, TENSORS)
    assert report.bytes >= TENSORS * TENSOR_BYTES  # checkpoint files add their safetensors headers
    # A chunk is at most one bucket; while the next one is gathered, only the tensor being yielded is extra.
    assert weights.peak_alive_bytes <= BUCKET_BYTES + TENSOR_BYTES
    assert weights.peak_alive_bytes < TENSORS * TENSOR_BYTES / 4


def test_chunks_never_exceed_the_target_and_a_larger_tensor_is_a_chunk_of_its_own() -> None:
    sizes = [100, 100, 5000, 10, 900, 64]  # float32 elements
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate(sizes)]
    chunks = [[name for name, _ in chunk] for chunk in chunks_of(iter(named), 1024)]
    assert chunks == [["t0", "t1"], ["t2"], ["t3"], ["t4"], ["t5"]]
    tensors = dict(named)
    stream = [sum(padded_size(tensors[n]) for n in chunk) for chunk in chunks]
    assert stream == [896, 20032, 64, 3648, 256]
    assert all(size <= 1024 or len(chunk) == 1 for size, chunk in zip(stream, chunks, strict=True))


def test_the_digest_taken_while_streaming_equals_the_digest_of_the_whole_set(tmp_path: Path) -> None:
    weights = GatheredWeights(seed=3)
    whole = list(GatheredWeights(seed=3)())
    digest = WeightsDigest()
    sender = _sender("gloo", tmp_path)
    sender.publish(1, digest.observe(weights()))
    sender.close()

    assert weights.passes == 1
    assert digest.value == weights_digest(whole) == weights_digest(reversed(whole))


@pytest.mark.parametrize(
    "change",
    [
        lambda named: [(named[0][0], named[0][1] + 1e-6), *named[1:]],  # bytes
        lambda named: [(named[0][0] + "_", named[0][1]), *named[1:]],  # a name
        lambda named: [(named[0][0], named[0][1].view(torch.int32)), *named[1:]],  # dtype, same bytes
        lambda named: [(named[0][0], named[0][1].reshape(2, -1)), *named[1:]],  # shape, same bytes
        lambda named: named[1:],  # a tensor missing
    ],
)
def test_the_digest_changes_with_any_name_dtype_shape_or_byte(change) -> None:
    named = list(GatheredWeights()())
    assert weights_digest(change(named)) != weights_digest(named)


def test_a_failing_update_still_iterates_the_weights_to_the_end(tmp_path: Path) -> None:
    """The other ranks of a sharded trainer gather every tensor: rank 0 must take part in each gather."""
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, [], bucket_mb=BUCKET_BYTES / 2**20)
    )
    # A gloo group whose device is a CUDA one this CPU-only torch lacks: the first CUDA call fails.
    sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device="cuda:0")
    sender.init()
    weights = GatheredWeights()
    with pytest.raises(SyncError, match="start of version 1"):
        sender.publish(1, weights())
    assert (weights.passes, weights.yielded) == (1, TENSORS)
    sender.close()


def test_a_failing_source_abandons_the_checkpoint_version_without_a_trace(tmp_path: Path) -> None:
    sender = _sender("checkpoint", tmp_path)

    def fails_midway() -> Iterator[tuple[str, torch.Tensor]]:
        yield from list(GatheredWeights()())[:8]
        raise RuntimeError("gather failed")

    with pytest.raises(RuntimeError, match="gather failed"):
        sender.publish(1, fails_midway())
    root = tmp_path / sender.spec.name
    assert list(root.iterdir()) == []  # no partial version, no temporary directory
    report = sender.publish(1, GatheredWeights()())  # the same version can be published again
    assert report.tensors == TENSORS and version_dir(root, 1).is_dir()
    sender.close()


def test_a_failing_source_breaks_a_collective_group_whose_receivers_are_mid_version(tmp_path: Path) -> None:
    sender = _sender("gloo", tmp_path)

    def fails_midway() -> Iterator[tuple[str, torch.Tensor]]:
        yield from list(GatheredWeights()())[:8]
        raise RuntimeError("gather failed")

    with pytest.raises(RuntimeError, match="gather failed"):
        sender.publish(1, fails_midway())
    with pytest.raises(SyncError, match="broken"):
        sender.publish(2, GatheredWeights()())
    sender.close()
