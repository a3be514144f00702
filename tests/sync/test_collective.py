"""Weight sync over a real gloo group on loopback: a sender in the test process, receivers in child processes."""

from __future__ import annotations

import socket
import time
import uuid

import pytest
import torch

from tests.sync.conftest import Receivers
from tests.sync.workers import results_by_rank, unpack
from trinity.sync import StaleVersion, SyncError, SyncGroupSpec, WeightReceiver, WeightSender, reserve_rendezvous
from trinity.sync.checksum import checksum_bytes, tensor_bytes


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """Mixed dtypes and shapes, including a non-contiguous tensor and a scalar."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 24, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(24, 24, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(40, 24, generator=g).t(),
        "model.layers.1.input_layernorm.weight": torch.randn(24, generator=g),
        "position_ids": torch.randint(-(2**40), 2**40, (3, 5), generator=g, dtype=torch.int64),
        "scale": torch.tensor(seed, dtype=torch.float32),
    }


def _spec(explorers: int, **fields: object) -> SyncGroupSpec:
    names = [f"explorer-{i}" for i in range(explorers)]
    # Joining waits for spawned receivers to import torch (slow on a busy machine); updates get 3 s.
    defaults: dict[str, object] = {"timeout_s": 3.0, "join_timeout_s": 120.0, "bucket_mb": 1.0}
    defaults.update(fields)
    return SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, names, **defaults)


def _assert_exact(got: dict[str, torch.Tensor], sums: dict[str, int], sent: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(sent)
    for name, tensor in sent.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name
        assert sums[name] == checksum_bytes("xxh3_64", tensor_bytes(tensor)), name


def test_two_receivers_get_exact_tensors_and_increasing_versions(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(2, bucket_mb=0.001))  # ~1 KB buckets: several per tensor
    receivers.spawn(rendezvous.spec, {1: ["ok", "ok"], 2: ["ok", "ok"]})
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    sent = {3: _weights(3), 7: _weights(7)}
    reports = [sender.publish(version, weights.items()) for version, weights in sent.items()]
    sender.close()

    assert [r.version for r in reports] == [3, 7]
    assert all(r.accepted_by_all for r in reports)
    for rank, items in results_by_rank(receivers.results, 4).items():
        assert [item[3] for item in items] == [3, 7], rank
        for _, _, outcome, version, packed, sums in items:
            assert outcome == "ok"
            _assert_exact(unpack(packed), sums, sent[version])


@pytest.mark.parametrize(
    ("bucket_bytes", "expected_buckets"),
    [
        # Smaller than most tensors: publish() cuts chunks of at most 1000 bytes, so each large tensor is a
        # chunk of its own split across buckets (6144 -> 7, 1152 -> 2, 3840 -> 4) and the three small ones
        # share one chunk of 320 bytes (1 bucket).
        (1000, 14),
        (64 * 2**20, 1),  # larger than everything: one chunk, one broadcast
    ],
)
def test_bucket_smaller_than_a_tensor_and_larger_than_all_both_work(
    receivers: Receivers, bucket_bytes: int, expected_buckets: int
) -> None:
    rendezvous = reserve_rendezvous(_spec(1, bucket_mb=bucket_bytes / 2**20))
    receivers.spawn(rendezvous.spec, {1: ["ok"]})
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    weights = _weights(11)
    report = sender.publish(1, weights.items())
    sender.close()

    # Each tensor is padded to a 64-byte boundary: 6144 + 1152 + 3840 + (96->128) + (120->128) + (4->64) = 11456.
    assert report.bytes == 11456
    assert report.buckets == expected_buckets
    (item,) = results_by_rank(receivers.results, 1)[1]
    assert item[2] == "ok"
    _assert_exact(unpack(item[4]), item[5], weights)


def test_corrupted_bucket_is_refused_and_the_group_serves_the_next_version(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(2, bucket_mb=0.001))
    receivers.spawn(rendezvous.spec, {1: ["corrupt", "ok"], 2: ["ok", "ok"]})
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    first = sender.publish(1, _weights(1).items())
    second = sender.publish(2, _weights(2).items())
    sender.close()

    assert first.refused == {1: "checksum_mismatch"}
    assert second.accepted_by_all
    results = results_by_rank(receivers.results, 4)
    assert [(item[2], item[3]) for item in results[1]] == [("checksum_mismatch", None), ("ok", 2)]
    assert "version 1: checksum mismatch in chunk 0 bucket 0" in results[1][0][5]["error"]
    assert [(item[2], item[3]) for item in results[2]] == [("ok", 1), ("ok", 2)]
    _assert_exact(unpack(results[1][1][4]), results[1][1][5], _weights(2))


def test_receiver_killed_mid_update_fails_the_sender_within_the_timeout_then_a_new_generation_works(
    receivers: Receivers,
) -> None:
    rendezvous = reserve_rendezvous(_spec(2, bucket_mb=0.001, timeout_s=3.0))
    receivers.spawn(rendezvous.spec, {1: ["die"], 2: ["fail_then_rejoin", "ok"]})
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    started = time.monotonic()
    with pytest.raises(SyncError) as failure:
        sender.publish(1, _weights(1).items())
    print(f"sender failed after {time.monotonic() - started:.2f}s: {failure.value}")
    assert time.monotonic() - started < 10
    with pytest.raises(SyncError, match="broken"):
        sender.start(2)  # a failed group refuses further use instead of hanging
    sender.close()
    survivor = results_by_rank(receivers.results, 1)[2][0]
    assert survivor[2] == "sync_error"
    print(f"survivor failed after {survivor[5]['seconds']:.2f}s: {survivor[5]['error']}")
    assert survivor[5]["seconds"] < 10

    spec = rendezvous.next_generation(["explorer-1"])
    assert (spec.generation, spec.world_size, spec.port) == (1, 2, rendezvous.port)
    receivers.control.put((spec.model_dump_json(), spec.rank_of("explorer-1")))
    sender = WeightSender(spec, rendezvous=rendezvous)
    sender.init()
    report = sender.publish(2, _weights(2).items())
    sender.close()
    assert report.accepted_by_all
    (item,) = results_by_rank(receivers.results, 1)[1]
    assert (item[2], item[3]) == ("ok", 2)
    _assert_exact(unpack(item[4]), item[5], _weights(2))


def test_versions_only_increase_on_the_sender() -> None:
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, [], timeout_s=3)
    )  # world size 1
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    sender.publish(5, _weights(5).items())
    with pytest.raises(StaleVersion):
        sender.start(5)
    sender.close()


def test_receiver_without_a_trainer_fails_within_the_timeout_instead_of_hanging() -> None:
    rendezvous = reserve_rendezvous(_spec(1, join_timeout_s=1.0))
    receiver = WeightReceiver(rendezvous.spec, 1)
    started = time.monotonic()
    with pytest.raises(SyncError, match="could not join"):
        receiver.init()
    assert time.monotonic() - started < 10
    receiver.close()


def test_reserved_rendezvous_port_cannot_be_taken_by_another_process() -> None:
    rendezvous = reserve_rendezvous(_spec(1))
    assert rendezvous.spec.port == rendezvous.port > 0
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", rendezvous.port))
