"""Whole-layer regrouping of streamed weights (vLLM must not see half a fused layer)."""

from __future__ import annotations

import pytest
import torch

from trinity.explorer.engines.weights import complete_groups, group_key

NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.1.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
    "model.norm.weight",
]


def tensors(names):
    return [(n, torch.zeros(2)) for n in names]


def test_group_key_is_the_decoder_layer_or_the_parent_module():
    assert group_key("model.layers.12.mlp.up_proj.weight") == "model.layers.12"
    assert group_key("model.norm.weight") == "model.norm"
    assert group_key("lm_head.weight") == "lm_head"


def test_interleaved_layers_are_emitted_only_when_complete():
    order = [NAMES[1], NAMES[3], NAMES[0], NAMES[2], NAMES[5], NAMES[4]]
    buckets = list(complete_groups(tensors(order), NAMES, bucket_bytes=1))  # 1 byte: one group per bucket
    assert [[n for n, _ in b] for b in buckets] == [
        [NAMES[0]],
        [NAMES[1], NAMES[2]],
        [NAMES[5]],
        [NAMES[3], NAMES[4]],
    ]


def test_small_groups_share_a_bucket():
    buckets = list(complete_groups(tensors(NAMES), NAMES))
    assert len(buckets) == 1
    assert [n for n, _ in buckets[0]] == NAMES


def test_tensor_unknown_to_the_checkpoint_passes_alone():
    buckets = list(complete_groups(tensors(["lm_head.weight"]), NAMES))
    assert [[n for n, _ in b] for b in buckets] == [["lm_head.weight"]]


def test_incomplete_layer_raises_after_the_complete_ones():
    stream = complete_groups(tensors([NAMES[0], NAMES[1]]), NAMES, bucket_bytes=1)
    assert [n for n, _ in next(stream)] == [NAMES[0]]
    with pytest.raises(ValueError, match=r"k_proj"):
        next(stream)
