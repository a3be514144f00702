"""After a failure a sync group is aborted, not shut down, so `close()` never waits for a dead peer; making a
group changes nothing process-wide; a GPU backend uses the device it is given. Real gloo groups on loopback,
receivers in spawned processes."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
import torch
import torch.distributed as dist

from tests.sync.conftest import Receivers
from trinity.sync import SyncError, SyncGroupSpec, WeightReceiver, WeightSender, reserve_rendezvous
from trinity.sync.placement import device_option


def _spec(explorers: int, **fields: object) -> SyncGroupSpec:
    names = [f"explorer-{i}" for i in range(explorers)]
    defaults: dict[str, object] = {"timeout_s": 3.0, "join_timeout_s": 120.0, "bucket_mb": 0.001}
    defaults.update(fields)
    return SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, names, **defaults)


def _weights() -> list[tuple[str, torch.Tensor]]:
    return [(f"model.layers.{i}.w", torch.randn(512)) for i in range(8)]


def test_close_returns_at_once_after_a_receiver_was_killed_mid_update(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(1))
    receivers.spawn(rendezvous.spec, {1: ["die"]})  # SIGKILLs itself at its second bucket
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    with pytest.raises(SyncError):
        sender.publish(1, _weights())
    assert sender.transport.broken is not None
    started = time.monotonic()
    sender.close()
    assert time.monotonic() - started < 2.0


def test_a_receiver_closes_at_once_after_its_trainer_stalled_mid_update() -> None:
    rendezvous = reserve_rendezvous(_spec(1))
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    receiver = WeightReceiver(rendezvous.spec, 1)
    # Both ranks join from this process: gloo's constructor waits for every rank, so the two run side by side.
    joined = threading.Thread(target=sender.init)
    joined.start()
    receiver.init()
    joined.join()
    sender.transport.store.set("update/1", "1")  # a doorbell with no update behind it: the trainer stalls
    with pytest.raises(SyncError):
        receiver.receive(idle_timeout_s=5)
    assert receiver.transport.broken is not None
    started = time.monotonic()
    receiver.close()
    assert time.monotonic() - started < 2.0
    sender.close()


def test_a_broken_group_refuses_reuse_instead_of_waiting() -> None:
    rendezvous = reserve_rendezvous(_spec(0))
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    sender.abandon("the test broke it")
    with pytest.raises(SyncError, match="broken"):
        sender.start(1)
    sender.close()


def test_making_and_using_a_group_leaves_the_process_environment_unchanged() -> None:
    before = dict(os.environ)
    rendezvous = reserve_rendezvous(_spec(0))
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    sender.publish(1, _weights())
    sender.close()
    assert dict(os.environ) == before


def test_joining_an_nccl_group_leaves_the_process_environment_unchanged() -> None:
    before = dict(os.environ)
    rendezvous = reserve_rendezvous(_spec(0, backend="nccl"))
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous, device="cuda:0")
    if hasattr(dist, "ProcessGroupNCCL") and torch.cuda.is_available():
        sender.init()
    else:
        with pytest.raises(SyncError, match="no NCCL"):
            sender.init()
    sender.close()
    assert dict(os.environ) == before


def test_an_nccl_member_keeps_the_cuda_device_it_was_given() -> None:
    spec = _spec(1, backend="nccl", port=29500)
    # cuda:1 names a device without asking CUDA which one is current: no GPU is needed to build the member.
    assert WeightReceiver(spec, 1, device="cuda:1").transport.device == torch.device("cuda", 1)
    assert WeightSender(spec, device=torch.device("cuda", 3)).transport.device == torch.device("cuda", 3)


def test_an_nccl_member_on_a_cpu_device_is_refused_with_the_reason() -> None:
    rendezvous = reserve_rendezvous(_spec(0, backend="nccl"))
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    with pytest.raises(SyncError, match=r"'nccl' needs a CUDA device.*was given cpu"):
        sender.init()
    sender.close()


def test_gpu_backends_get_the_members_own_device_and_the_others_none() -> None:
    gpu = torch.device("cuda", 2)
    assert device_option("nccl", gpu) == {"device": gpu}
    assert device_option("cuda_ipc", gpu) == {"device": gpu}
    assert device_option("gloo", gpu) == {}
    assert device_option("checkpoint", gpu) == {}
    assert device_option("nccl", torch.device("cpu")) == {}
    assert device_option("nccl", None) == {}
