"""Weights on another device than the group's are staged bucket by bucket (needs a GPU: marked `gpu`)."""

from __future__ import annotations

import uuid

import pytest
import torch

from trinity.sync import SyncGroupSpec, reserve_rendezvous
from trinity.sync.checksum import tensor_bytes
from trinity.sync.collective import WeightSender
from trinity.sync.protocol import ChunkLayout

pytestmark = pytest.mark.gpu


def test_cpu_weights_fill_a_cuda_bucket_by_copy() -> None:
    big = torch.randn(100)
    layout = ChunkLayout.plan([("big", big)], bucket_bytes=64)
    staging = torch.empty(64, dtype=torch.uint8, device="cuda")
    bucket = layout.fill_bucket(1, [tensor_bytes(big)], staging)
    assert bucket.device.type == "cuda" and bucket.data_ptr() == staging.data_ptr()
    assert torch.equal(bucket.cpu(), tensor_bytes(big)[64:128])


def test_cpu_weights_publish_through_an_nccl_group() -> None:
    spec = SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, [], backend="nccl", bucket_mb=0.01, timeout_s=30)
    rendezvous = reserve_rendezvous(spec)
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    weights = [(f"model.layers.{i}.w", torch.randn(1000)) for i in range(8)]
    report = sender.publish(1, weights)  # a ValueError at the first tensor before per-bucket device copies
    sender.close()
    assert report.tensors == 8 and report.accepted_by_all
