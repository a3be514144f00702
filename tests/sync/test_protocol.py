"""Layout, bucketing and grouping rules of the sync protocol, and the spec the Gateway negotiates."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from trinity.sync import SyncGroupSpec, group_by_layer
from trinity.sync.checksum import tensor_bytes
from trinity.sync.protocol import ChunkLayout, layer_key


def test_layout_aligns_offsets_and_buckets_cut_the_byte_stream() -> None:
    named = [("a", torch.arange(10, dtype=torch.int32)), ("b", torch.ones(3, dtype=torch.bfloat16))]
    layout = ChunkLayout.plan(named, bucket_bytes=48)
    assert layout.offsets == [0, 64]  # 40 bytes of `a`, padded to 64
    assert layout.nbytes == [40, 6]
    assert layout.total_bytes == 128
    assert layout.bucket_count == 3
    assert [layout.bucket_range(i) for i in range(3)] == [(0, 48), (48, 96), (96, 128)]


def test_buckets_reassemble_into_the_original_tensors() -> None:
    named = [
        ("x", torch.randn(7, 3)),
        ("y", torch.randint(0, 100, (5,), dtype=torch.int64)),
        ("z", torch.randn(4, 2).to(torch.bfloat16)),
    ]
    layout = ChunkLayout.plan(named, bucket_bytes=20)
    sources = [tensor_bytes(t) for _, t in named]
    staging = torch.empty(20, dtype=torch.uint8)
    stream = torch.cat([layout.fill_bucket(i, sources, staging).clone() for i in range(layout.bucket_count)])
    assert stream.numel() == layout.total_bytes
    assert stream[84:128].eq(0).all()  # padding after `x` (84 bytes) is zeroed, not stale staging bytes
    for (name, sent), (got_name, got) in zip(named, layout.tensors(stream), strict=True):
        assert name == got_name and got.dtype == sent.dtype and torch.equal(got, sent)


def test_a_bucket_inside_one_tensor_is_sent_without_a_copy() -> None:
    big = torch.randn(100)
    layout = ChunkLayout.plan([("big", big)], bucket_bytes=64)
    bucket = layout.fill_bucket(1, [tensor_bytes(big)], torch.empty(64, dtype=torch.uint8))
    assert bucket.data_ptr() == big.data_ptr() + 64


def test_layer_groups_never_split_a_decoder_layer() -> None:
    names = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",  # out of order: still grouped with layer 0
        "model.layers.10.mlp.up_proj.weight",
        "model.norm.weight",
    ]
    groups = [[n for n, _ in g] for g in group_by_layer((n, torch.zeros(1)) for n in names)]
    assert groups == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"],
        ["model.layers.1.self_attn.q_proj.weight"],
        ["model.layers.10.mlp.up_proj.weight"],
        ["model.norm.weight"],
    ]
    assert layer_key("language_model.model.layers.3.mlp.w") == "language_model.model.layers.3."


def test_spec_assigns_the_trainer_rank_zero_and_explorers_the_rest() -> None:
    spec = SyncGroupSpec.for_members("run", 0, ["e-a", "e-b"], bucket_mb=0.5)
    assert spec.ranks == {"trainer": 0, "e-a": 1, "e-b": 2} and spec.world_size == 3
    assert spec.bucket_bytes == 2**19
    following = spec.next_generation(["e-b"])
    assert (following.generation, following.ranks, following.bucket_mb) == (1, {"trainer": 0, "e-b": 1}, 0.5)
    assert following.store_prefix != spec.store_prefix


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ranks": {"trainer": 1, "e": 0}}, "must be rank 0"),
        ({"ranks": {"trainer": 0, "e": 2}}, "exactly once"),
        ({"ranks": {"trainer": 0, "e": 1}, "backend": "checkpoint"}, "checkpoint_dir"),
    ],
)
def test_spec_rejects_bad_rank_assignments(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SyncGroupSpec(name="run", generation=0, world_size=2, **fields)  # type: ignore[arg-type]


def test_spec_imports_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys; import trinity.sync as s; s.SyncGroupSpec; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
