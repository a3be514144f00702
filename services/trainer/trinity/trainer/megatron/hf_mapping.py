"""Hugging Face Llama/Qwen2 weights <-> Megatron-Core GPTModel (local layer spec) shards.

Pure tensor functions, no process groups: the same code splits a checkpoint for a (TP rank, PP stage)
and merges gathered shards back, so the round trip is testable in one process.

Layout of the Megatron side (per TP rank, per PP stage; layer indices local to the stage):
- `embedding.word_embeddings.weight` `[vocab/tp, hidden]` (first stage), `output_layer.weight` the same
  shape (last stage; with tied embeddings a copy of the embedding that the optimizer keeps in sync);
- `decoder.layers.i.self_attention.linear_qkv.weight` `[(q+2k) per local group * head_dim, hidden]`:
  for each query group, its query heads then its key head then its value head, groups split over TP;
- `...linear_proj.weight` `[hidden, heads/tp * head_dim]` (row parallel: input dim split);
- `...mlp.linear_fc1.weight` `[2 * ffn/tp, hidden]` = this rank's gate rows then its up rows;
- `...mlp.linear_fc2.weight` `[hidden, ffn/tp]`; the norms are replicated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Tensor = torch.Tensor
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers both sides agree on, read from a HF `config.json`."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def shape_from_hf_config(cfg: dict[str, Any]) -> ModelShape:
    """`cfg`: the parsed `config.json` of a Llama/Qwen2/Mistral-style model."""
    archs = cfg.get("architectures") or []
    if archs and archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"the Megatron backend maps {', '.join(SUPPORTED_ARCHITECTURES)}, not {archs[0]}; "
            "use trainer.backend: torch"
        )
    _refuse_unmapped_features(cfg, archs[0] if archs else "this model")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"rope scaling {rope_type!r} is not mapped to Megatron yet (only default RoPE)")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return ModelShape(
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(cfg["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        vocab_size=int(cfg["vocab_size"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", archs[:1] == ["Qwen2ForCausalLM"])),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
    )


def _refuse_unmapped_features(cfg: dict[str, Any], arch: str) -> None:
    """Raise for settings of a supported architecture that the local layer spec does not compute, rather than
    train a different model than the sampler serves."""
    max_len = int(cfg.get("max_position_embeddings", 4096))
    window = cfg.get("sliding_window")
    sliding = "sliding_attention" in (cfg.get("layer_types") or ()) or (
        window is not None and cfg.get("use_sliding_window") is not False and int(window) < max_len
    )
    if sliding:
        raise ValueError(
            f"{arch} uses sliding-window attention (sliding_window={window}, below max_position_embeddings="
            f"{max_len}); the Megatron backend computes full attention only: use trainer.backend: torch"
        )
    # Qwen2's q/k/v biases map to linear_qkv's; Llama's `attention_bias` also biases o_proj, which has no slot.
    if cfg.get("attention_bias") and arch != "Qwen2ForCausalLM":
        raise ValueError(
            f"{arch} with attention_bias: true is not mapped to Megatron (o_proj bias); use trainer.backend: torch"
        )
    if cfg.get("mlp_bias"):
        raise ValueError(f"{arch} with mlp_bias: true is not mapped to Megatron; use trainer.backend: torch")


def check_parallelism(shape: ModelShape, tp: int, pp: int) -> None:
    """Raise with the fix when the model cannot be split `tp` x `pp` ways."""
    for what, n in (
        ("num_key_value_heads", shape.num_kv_heads),
        ("intermediate_size", shape.ffn_hidden_size),
        ("vocab_size", shape.vocab_size),
    ):
        if n % tp:
            raise ValueError(f"{what}={n} is not divisible by tensor_parallel_size={tp}")
    if shape.num_layers % pp:
        raise ValueError(f"num_hidden_layers={shape.num_layers} is not divisible by pipeline_parallel_size={pp}")


def stage_layers(shape: ModelShape, pp: int, pp_rank: int) -> range:
    """Global indices of the decoder layers on pipeline stage `pp_rank` (even split, as Megatron does)."""
    per = shape.num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def _split(t: Tensor, tp: int, rank: int, dim: int) -> Tensor:
    return t.chunk(tp, dim=dim)[rank].clone()


def pack_qkv(q: Tensor, k: Tensor, v: Tensor, shape: ModelShape, tp: int, rank: int) -> Tensor:
    """HF q `[heads*d, ...]`, k/v `[kv_heads*d, ...]` (weights or biases) -> this rank's `linear_qkv`."""
    g, d, hpg = shape.num_kv_heads, shape.head_dim, shape.heads_per_group
    rest = q.shape[1:]
    packed = torch.cat([q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return _split(packed, tp, rank, 0).reshape(-1, *rest)


def unpack_qkv(shards: list[Tensor], shape: ModelShape) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of `pack_qkv` over all TP ranks' shards (in rank order)."""
    g, d, hpg = shape.num_kv_heads, shape.head_dim, shape.heads_per_group
    full = torch.cat(shards, dim=0)
    rest = full.shape[1:]
    grouped = full.reshape(g, (hpg + 2) * d, *rest)
    q, k, v = grouped.split([hpg * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_megatron(
    get: Callable[[str], Tensor], shape: ModelShape, tp: int, tp_rank: int, pp: int, pp_rank: int
) -> dict[str, Tensor]:
    """This rank's Megatron state dict; `get(hf_name)` returns a full HF tensor (read lazily)."""
    out: dict[str, Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp - 1
    if first:
        out["embedding.word_embeddings.weight"] = _split(get("model.embed_tokens.weight"), tp, tp_rank, 0)
    for local, layer in enumerate(stage_layers(shape, pp, pp_rank)):
        hf, mg = f"model.layers.{layer}.", f"decoder.layers.{local}."
        att = hf + "self_attn."
        out[mg + "input_layernorm.weight"] = get(hf + "input_layernorm.weight").clone()
        out[mg + "self_attention.linear_qkv.weight"] = pack_qkv(
            get(att + "q_proj.weight"), get(att + "k_proj.weight"), get(att + "v_proj.weight"), shape, tp, tp_rank
        )
        if shape.qkv_bias:
            out[mg + "self_attention.linear_qkv.bias"] = pack_qkv(
                get(att + "q_proj.bias"), get(att + "k_proj.bias"), get(att + "v_proj.bias"), shape, tp, tp_rank
            )
        out[mg + "self_attention.linear_proj.weight"] = _split(get(att + "o_proj.weight"), tp, tp_rank, 1)
        out[mg + "pre_mlp_layernorm.weight"] = get(hf + "post_attention_layernorm.weight").clone()
        gate = _split(get(hf + "mlp.gate_proj.weight"), tp, tp_rank, 0)
        up = _split(get(hf + "mlp.up_proj.weight"), tp, tp_rank, 0)
        out[mg + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[mg + "mlp.linear_fc2.weight"] = _split(get(hf + "mlp.down_proj.weight"), tp, tp_rank, 1)
    if last:
        out["decoder.final_layernorm.weight"] = get("model.norm.weight").clone()
        if not shape.tied_embeddings:
            out["output_layer.weight"] = _split(get("lm_head.weight"), tp, tp_rank, 0)
        elif not first:  # tied, on another stage: the last stage keeps its own copy of the embedding
            out["output_layer.weight"] = _split(get("model.embed_tokens.weight"), tp, tp_rank, 0)
    return out


def megatron_to_hf(
    name: str, shards: list[Tensor], shape: ModelShape, layer_offset: int
) -> Iterator[tuple[str, Tensor]]:
    """HF tensors of one Megatron parameter, given its shards from every TP rank (in rank order).

    `layer_offset`: global index of the stage's first layer. A tied `output_layer.weight` yields nothing
    (the embedding is exported once, from the first stage).
    """
    if name == "embedding.word_embeddings.weight":
        yield "model.embed_tokens.weight", torch.cat(shards, 0)
        return
    if name == "output_layer.weight":
        if not shape.tied_embeddings:
            yield "lm_head.weight", torch.cat(shards, 0)
        return
    if name == "decoder.final_layernorm.weight":
        yield "model.norm.weight", shards[0]
        return
    parts = name.split(".")
    if parts[:2] != ["decoder", "layers"]:
        raise KeyError(f"no Hugging Face name for Megatron parameter {name!r}")
    hf = f"model.layers.{int(parts[2]) + layer_offset}."
    sub = ".".join(parts[3:])
    if sub == "input_layernorm.weight":
        yield hf + "input_layernorm.weight", shards[0]
    elif sub == "pre_mlp_layernorm.weight":
        yield hf + "post_attention_layernorm.weight", shards[0]
    elif sub in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = sub.rsplit(".", 1)[1]
        q, k, v = unpack_qkv(shards, shape)
        yield from ((f"{hf}self_attn.{p}_proj.{kind}", t) for p, t in (("q", q), ("k", k), ("v", v)))
    elif sub == "self_attention.linear_proj.weight":
        yield hf + "self_attn.o_proj.weight", torch.cat(shards, 1)
    elif sub == "mlp.linear_fc1.weight":
        halves = [s.chunk(2, dim=0) for s in shards]
        yield hf + "mlp.gate_proj.weight", torch.cat([h[0] for h in halves], 0)
        yield hf + "mlp.up_proj.weight", torch.cat([h[1] for h in halves], 0)
    elif sub == "mlp.linear_fc2.weight":
        yield hf + "mlp.down_proj.weight", torch.cat(shards, 1)
    else:
        raise KeyError(f"no Hugging Face name for Megatron parameter {name!r}")
