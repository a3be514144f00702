"""HF -> Megatron shards -> HF is bit-exact for every TP x PP split, tied or not, with or without qkv bias."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trinity.trainer.megatron.hf_mapping import (
    ModelShape,
    check_parallelism,
    hf_to_megatron,
    megatron_to_hf,
    pack_qkv,
    shape_from_hf_config,
    stage_layers,
)


def _shape(tied: bool, bias: bool) -> ModelShape:
    return ModelShape(
        num_layers=4, hidden_size=32, ffn_hidden_size=48, num_heads=8, num_kv_heads=4, head_dim=4,
        vocab_size=40, tied_embeddings=tied, qkv_bias=bias, norm_eps=1e-6, rope_theta=1e4,
        max_position_embeddings=64,
    )  # fmt: skip


def _random_hf(shape: ModelShape, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, f, d = shape.hidden_size, shape.ffn_hidden_size, shape.head_dim
    q, kv = shape.num_heads * d, shape.num_kv_heads * d
    state = {
        "model.embed_tokens.weight": torch.randn(shape.vocab_size, h, generator=g),
        "model.norm.weight": torch.randn(h, generator=g),
    }
    if not shape.tied_embeddings:
        state["lm_head.weight"] = torch.randn(shape.vocab_size, h, generator=g)
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        dims = {
            "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h),
            "mlp.down_proj.weight": (h, f), "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        }  # fmt: skip
        if shape.qkv_bias:
            dims.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
        state.update({p + k: torch.randn(*v, generator=g) for k, v in dims.items()})
    return state


def _round_trip(hf: dict[str, torch.Tensor], shape: ModelShape, tp: int, pp: int) -> dict[str, torch.Tensor]:
    shards = {(t, p): hf_to_megatron(hf.__getitem__, shape, tp, t, pp, p) for t in range(tp) for p in range(pp)}
    out: dict[str, torch.Tensor] = {}
    for p in range(pp):
        offset = stage_layers(shape, pp, p)[0]
        for name in shards[(0, p)]:
            for hf_name, tensor in megatron_to_hf(name, [shards[(t, p)][name] for t in range(tp)], shape, offset):
                assert hf_name not in out, f"{hf_name} exported twice"
                out[hf_name] = tensor
    return out


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)])
@pytest.mark.parametrize(("tied", "bias"), [(True, False), (False, True)])
def test_round_trip_is_bit_exact(tp: int, pp: int, tied: bool, bias: bool) -> None:
    shape = _shape(tied, bias)
    hf = _random_hf(shape)
    back = _round_trip(hf, shape, tp, pp)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_round_trip_of_the_tiny_llama_checkpoint(tiny_model: Path) -> None:
    shape = shape_from_hf_config(json.loads((tiny_model / "config.json").read_text()))
    hf = load_file(str(tiny_model / "model.safetensors"))
    back = _round_trip(hf, shape, 2, 2)
    assert back.keys() == hf.keys() and all(torch.equal(back[k], hf[k]) for k in hf)


def test_qkv_packing_puts_each_groups_query_heads_before_its_key_and_value() -> None:
    # 2 groups x 2 query heads, head_dim 1, hidden 1: rows are labelled by their HF origin.
    shape = ModelShape(1, 1, 2, 4, 2, 1, 4, True, False, 1e-6, 1e4, 8)
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])  # heads 0,1 in group 0; heads 2,3 in group 1
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    assert pack_qkv(q, k, v, shape, 1, 0).flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    assert pack_qkv(q, k, v, shape, 2, 1).flatten().tolist() == [12, 13, 21, 31]


def test_an_indivisible_split_is_refused_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="num_key_value_heads=4 is not divisible by tensor_parallel_size=3"):
        check_parallelism(_shape(True, False), 3, 1)
    with pytest.raises(ValueError, match="num_hidden_layers=4 is not divisible by pipeline_parallel_size=3"):
        check_parallelism(_shape(True, False), 1, 3)
