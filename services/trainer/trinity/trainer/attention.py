"""The trainer's attention under bf16 autocast on a CPU: PyTorch's SDPA on float32 q/k/v.

Autocast sends `scaled_dot_product_attention` to bf16, and on a CPU the bf16 flash-attention backward is
about 2-3x slower than the fp32 one at the trainer's shapes (SmolLM2 on the quickstart batch: 8 rows of 171
tokens, 9 heads of 64). That kernel splits each (row, head) into 32-query blocks and runs three of each block's
five small GEMMs as oneDNN matmul primitives (1,296 calls per layer here, seen with `ONEDNN_VERBOSE=1`), where
fp32 calls MKL's sgemm directly; the per-call cost dominates products this small. The forward is a few GEMMs
per block through oneDNN's brgemm micro-kernels in either dtype, so it costs about the same in both.

Running SDPA in fp32 (autocast off, q/k/v upcast; RoPE has already made q and k fp32) takes the fast backward,
and the attention is computed more exactly, not less. The output stays fp32: `o_proj` under autocast casts it
to bf16 as it would any input. Everything else keeps bf16 autocast.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SDPA_FP32 = "trinity_sdpa_fp32"


def sdpa_fp32_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hugging Face's SDPA attention (`[rows, heads, seq, head_dim]` in, `[rows, seq, heads, head_dim]` out)
    with autocast off and float32 q/k/v; the same masks, scaling and GQA handling."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast(query.device.type, enabled=False):
        return sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)


def use_fp32_attention(model: nn.Module, autocast: bool, device: torch.device) -> bool:
    """Switch a Hugging Face model from SDPA to `sdpa_fp32_attention` where it is faster: bf16 autocast on a CPU
    (a GPU's bf16 kernels are fast). Other implementations (eager, flash) are left alone. True if switched."""
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if not (autocast and device.type == "cpu" and isinstance(model, PreTrainedModel)):
        return False
    if model.config._attn_implementation != "sdpa":
        return False
    # Registering is idempotent; the masks must be SDPA's too (an unknown name would get none at all)
    AttentionInterface.register(SDPA_FP32, sdpa_fp32_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SDPA_FP32, sdpa_mask)
    model.set_attn_implementation(SDPA_FP32)
    return True
