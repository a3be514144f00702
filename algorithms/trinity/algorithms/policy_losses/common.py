"""Shared pieces of the policy-loss call convention.

A policy loss is called with keyword tensors, each ``[batch, seq]`` unless noted:

- ``logprobs``: log-probabilities of the sampled tokens under the policy being trained (with grad),
- ``old_logprobs``: the same under the policy that sampled them (no grad),
- ``advantages``: from an advantage estimator, zero on masked positions,
- ``mask``: boolean, true on trained tokens,
- optionally ``ref_logprobs`` (reference model), ``expert_mask`` (``[batch]`` bool, CHORD), ``step`` (int).

It returns ``(loss, metrics)``: a scalar tensor to backpropagate and a ``dict[str, float]`` for logging.
A loss names every input it reads; the trainer hands it exactly those (``BoundFn.inputs``).
"""

from __future__ import annotations

import torch

from ..aggregation import masked_mean

PolicyLossOutput = tuple[torch.Tensor, dict[str, float]]

# exp() of a log-ratio beyond this overflows float16/bfloat16 ranges; verl clamps the same way.
MAX_LOG_RATIO = 20.0


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """``log(pi / pi_old)`` per token, clamped to [-20, 20] so ``exp`` stays finite."""
    return torch.clamp(logprobs - old_logprobs, min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO)


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Masked mean of ``old_logprobs - logprobs`` (the k1 estimate of ``KL(pi_old || pi)``), for logging."""
    return masked_mean((old_logprobs - logprobs).detach(), mask).item()


def resolve_clip(clip_range: float | None, low: float | None, high: float | None) -> tuple[float, float]:
    """Trinity-RFT convention: ``clip_range_low/high`` override the symmetric ``clip_range``."""
    lo = low if low is not None else clip_range
    hi = high if high is not None else clip_range
    if lo is None or hi is None:
        raise ValueError("set clip_range, or both clip_range_low and clip_range_high")
    return float(lo), float(hi)
