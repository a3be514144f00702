"""Checkpoint fallback: safetensors + manifest in a shared directory, written atomically, verified on load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from trinity.sync import (
    CheckpointReceiver,
    CheckpointSender,
    ChecksumMismatch,
    NoUpdateYet,
    StaleVersion,
    SyncError,
    SyncGroupSpec,
    open_receiver,
    open_sender,
)


def _spec(directory: Path) -> SyncGroupSpec:
    return SyncGroupSpec.for_members("ckpt", 0, ["explorer-0"], backend="checkpoint", checkpoint_dir=str(directory))


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(32, 8, generator=g)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(4, 8, generator=g),
        "model.layers.1.mlp.up_proj.weight": torch.randn(8, 16, generator=g).t(),
        "model.norm.weight": torch.ones(8),
        "lm_head.weight": embed,  # tied: shares storage with the embedding
        "position_ids": torch.arange(5, dtype=torch.int64),
    }


def test_round_trip_is_exact_and_chosen_by_the_spec_backend(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    sender, receiver = open_sender(spec), open_receiver(spec, 1)
    assert isinstance(sender, CheckpointSender) and isinstance(receiver, CheckpointReceiver)
    sender.init()
    receiver.init()
    for version in (1, 2):
        sent = _weights(version)
        items = list(sent.items())
        sender.start(version)
        sender.update(items[:3])  # two update() calls: two safetensors files in one version
        sender.update(items[3:])
        sender.finish(version)
        got_version, named = receiver.receive(idle_timeout_s=5)
        got = dict(named)
        assert got_version == version
        assert list(got) == list(sent)
        for name, tensor in sent.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    assert sorted(p.name for p in (tmp_path / "ckpt" / "v000000000002").iterdir()) == [
        "manifest.json",
        "model-00000.safetensors",
        "model-00001.safetensors",
    ]
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))


def test_corrupted_file_is_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    sender, receiver = CheckpointSender(spec), CheckpointReceiver(spec, 1)
    sender.init()
    sender.publish(1, _weights(1).items())
    shard = tmp_path / "ckpt" / "v000000000001" / "model-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # one bit in the last tensor's bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match="version 1"):
        receiver.receive(idle_timeout_s=1)
    assert receiver.version is None


def test_receiver_hands_over_whole_layers_and_only_newer_versions(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    sender, receiver = CheckpointSender(spec, keep=1), CheckpointReceiver(spec, 1, poll_interval_s=0.01)
    sender.init()
    sender.publish(1, _weights(1).items())
    sender.publish(2, _weights(2).items())  # the receiver skips straight to the newest version
    calls: list[tuple[int, list[str]]] = []
    assert receiver.receive_into(lambda v, named: calls.append((v, [n for n, _ in named]))) == 2
    assert calls == [
        (2, ["model.embed_tokens.weight"]),
        (2, ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]),
        (2, ["model.layers.1.mlp.up_proj.weight"]),
        (2, ["model.norm.weight"]),
        (2, ["lm_head.weight"]),
        (2, ["position_ids"]),
    ]
    assert [p.name for p in (tmp_path / "ckpt").glob("v*")] == ["v000000000002"]  # keep=1 pruned version 1
    with pytest.raises(NoUpdateYet, match="no new weight version"):
        receiver.receive(idle_timeout_s=0.05)


def test_restarted_sender_does_not_publish_an_older_version(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    first = CheckpointSender(spec)
    first.init()
    first.publish(4, _weights(4).items())
    restarted = CheckpointSender(spec)
    restarted.init()
    with pytest.raises(StaleVersion):
        restarted.start(3)


def test_a_disk_failure_mid_version_is_a_sync_error_and_the_version_can_be_published_again(tmp_path: Path) -> None:
    sender = CheckpointSender(_spec(tmp_path))
    sender.init()
    sender.start(1)
    assert sender._tmp is not None
    shutil.rmtree(sender._tmp)  # the shared directory lost the version being written
    with pytest.raises(SyncError, match="chunk 0 of version 1"):
        sender.update(_weights(1).items())
    sender.close()  # what the publisher does before it re-forms the group and retries
    report = sender.publish(1, _weights(1).items())
    assert report.tensors == len(_weights(1))
