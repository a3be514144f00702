"""Hugging-Face-named weights of the policy, for weight sync and `save_hf`.

With LoRA the adapters are merged into the base weights on the fly (W + scale * B @ A) on a copy, so the
training model keeps its separate adapters and the consumer sees plain, full-rank tensors under the
names the original checkpoint used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trinity.trainer.models import causal_lm


def _lora_deltas(model: nn.Module) -> dict[str, torch.Tensor]:
    """HF name of each LoRA-adapted weight -> its merged delta (scale * B @ A)."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    lm = causal_lm(model)
    for name, module in lm.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    # Every concrete LoraLayer (Linear, Embedding, Conv) defines it; the mixin base does not.
                    delta = module.get_delta_weight(adapter)  # type: ignore[attr-defined]
                    key = f"{name}.weight"
                    deltas[key] = deltas[key] + delta if key in deltas else delta
    return deltas


def _hf_name(name: str) -> str:
    # peft keeps the original weight of an adapted Linear under `<module>.base_layer.weight`.
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def named_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(hf_name, tensor)` for every parameter of the policy, LoRA merged, tied weights once.

    Tensors are detached; merged LoRA weights are fresh tensors, others share storage with the model
    (consumers must copy before the next optimizer step if they keep them).
    """
    lm = causal_lm(model)
    deltas = _lora_deltas(model) if lm is not model else {}
    seen: set[int] = set()
    for name, param in lm.named_parameters(remove_duplicate=False):
        if "lora_" in name:
            continue
        if id(param) in seen:
            continue
        seen.add(id(param))
        hf = _hf_name(name)
        tensor = param.detach()
        if hf in deltas:
            tensor = tensor + deltas[hf].to(tensor.dtype)
        yield hf, tensor


def save_hf(model: nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Write the policy (LoRA merged) as a plain Hugging Face directory with its tokenizer."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm = causal_lm(model)
    config = lm.config
    if lm is model:
        lm.save_pretrained(out, safe_serialization=True)
    else:
        plain = AutoModelForCausalLM.from_config(config, dtype=next(lm.parameters()).dtype)
        state = dict(named_weights(model))
        missing, unexpected = plain.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(f"merged LoRA weights do not match the model: {missing=} {unexpected=}")
        plain.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
