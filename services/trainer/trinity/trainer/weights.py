"""Hugging-Face-named weights of the policy, for weight sync and `save_hf`.

With LoRA the adapters are merged into the base weights on the fly (W + scale * B @ A) on a copy, so the
training model keeps its separate adapters and the consumer sees plain, full-rank tensors under the
names the original checkpoint used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trinity.trainer.models import causal_lm


def _lora_layers(model: nn.Module) -> dict[str, Any]:
    """HF name of each LoRA-adapted weight -> its LoRA layer (the delta is computed when the weight is yielded)."""
    from peft.tuners.lora import LoraLayer

    lm = causal_lm(model)
    return {f"{name}.weight": module for name, module in lm.named_modules() if isinstance(module, LoraLayer)}


def _lora_delta(module: Any) -> torch.Tensor | None:
    """scale * B @ A summed over the layer's active adapters (`module` is a peft LoraLayer)."""
    delta = None
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            # Every concrete LoraLayer (Linear, Embedding, Conv) defines it; the mixin base does not.
            d = module.get_delta_weight(adapter)
            delta = d if delta is None else delta + d
    return delta


def _hf_name(name: str) -> str:
    # peft keeps the original weight of an adapted Linear under `<module>.base_layer.weight`.
    return name.replace(".base_layer.", ".")


_BLOCK = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def block_index(hf_name: str) -> int | None:
    """The decoder block a weight belongs to (`model.layers.<i>.`), None outside the blocks."""
    match = _BLOCK.search(hf_name)
    return int(match.group(1)) if match else None


UnitOf = Callable[[str], nn.Module]
"""HF weight name -> the module whose parameters must be gathered (unsharded) to read it (FSDP2 unit)."""


@torch.no_grad()
def named_weights(model: nn.Module, unit_of: UnitOf | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` in the checkpoint's layout for every weight of the policy (`_model_weights`).

    transformers may hold weights in another layout than its checkpoints (an MoE's experts fused into one
    `[experts, ...]` tensor per layer) and converts them back when it saves; the engines and the sync read
    checkpoint names, so the same conversion runs here, one decoder block at a time (a conversion may need
    several tensors of a block at once).
    """
    lm = causal_lm(model)
    tensors = _model_weights(model, unit_of)
    if not getattr(lm, "_weight_conversions", None):  # set by from_pretrained: the conversions it applied
        yield from tensors
        return
    from transformers.core_model_loading import revert_weight_conversion

    block: dict[str, torch.Tensor] = {}
    for name, tensor in tensors:
        if block and block_index(name) != block_index(next(iter(block))):
            yield from revert_weight_conversion(lm, block).items()
            block = {}
        block[name] = tensor
    if block:
        yield from revert_weight_conversion(lm, block).items()


@torch.no_grad()
def _model_weights(model: nn.Module, unit_of: UnitOf | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` for every parameter of the policy as transformers names it, LoRA merged, tied
    weights once.

    Sharded (`unit_of` given): each FSDP2 unit is gathered when its first weight is reached and freed after
    its last, so at most one block beside the root's weights is whole at a time; a collective, so every
    rank iterates to the end. Tensors are detached; merged LoRA weights and gathered weights are fresh
    tensors, others share storage with the model (consumers copy before the next optimizer step if they
    keep them).
    """
    lm = causal_lm(model)
    lora = _lora_layers(model) if lm is not model else {}
    names: list[str] = []
    seen: set[int] = set()
    for name, param in lm.named_parameters(remove_duplicate=False):
        if "lora_" not in name and id(param) not in seen:
            seen.add(id(param))
            names.append(name)
    gathered: list[Any] = []  # the units gathered now: the root first, then the current block
    try:
        for name in names:
            hf = _hf_name(name)
            if unit_of is not None:
                _gather(unit_of(hf), gathered)
            tensor = lm.get_parameter(name).detach()
            if hf in lora:
                delta = _lora_delta(lora[hf])
                if delta is not None:
                    tensor = tensor + delta.to(tensor.dtype)
            elif unit_of is not None:
                tensor = tensor.clone()  # the gathered storage is freed when its unit is resharded
            yield hf, tensor
    finally:
        for unit in reversed(gathered):
            unit.reshard()


def _gather(unit: Any, gathered: list[Any]) -> None:
    """Unshard `unit` unless it is gathered already; a block replaces the previous block (the root stays)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(unit, FSDPModule) or any(u is unit for u in gathered):
        return
    if len(gathered) > 1:
        gathered.pop().reshard()
    unit.unshard()
    gathered.append(unit)


def save_hf(
    model: nn.Module, tokenizer: Any, out_dir: str | Path, unit_of: UnitOf | None = None, *, write: bool = True
) -> Path:
    """Write the policy (LoRA merged) as a plain Hugging Face directory with its tokenizer.

    Sharded (`unit_of`), every rank gathers the weights and only the rank with `write` writes them."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    lm = causal_lm(model)
    config = lm.config
    if lm is model and unit_of is None:
        out.mkdir(parents=True, exist_ok=True)
        lm.save_pretrained(out, safe_serialization=True)
    else:
        # The model's own layout: `save_pretrained` converts it to the checkpoint's.
        state = dict(_model_weights(model, unit_of))
        if not write:
            return out
        out.mkdir(parents=True, exist_ok=True)
        plain = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
        state = {k: v.cpu() for k, v in state.items()}
        missing, unexpected = plain.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(f"merged LoRA weights do not match the model: {missing=} {unexpected=}")
        plain.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
