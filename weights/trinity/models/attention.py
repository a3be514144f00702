"""How transformers should compute a model's attention, read from the model's config."""

from __future__ import annotations

from pathlib import Path


def attention_options(path: str | Path) -> dict[str, str]:
    """`from_pretrained` options that make transformers compute the attention the model defines.

    Its default, SDPA, has no soft-capping of attention scores and silently leaves Gemma 2's
    `attn_logit_softcapping` out (measured on the tiny Gemma 2 of tests/models with a cap of 0.05: SDPA's logits
    differed from eager attention's by 0.048, exactly as much as eager's with and without the cap); eager
    attention applies it, as vLLM does.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    return {"attn_implementation": "eager"} if getattr(config, "attn_logit_softcapping", None) else {}
