"""REINFORCE-style losses (``-weight * A * logprobs``): TOPR, OPMD (used by AsymRE), REC."""

from __future__ import annotations

import torch

from ..aggregation import agg_loss, masked_mean
from ..registry import register_policy_loss
from .common import PolicyLossOutput, approx_kl, log_ratio


@register_policy_loss("topr")
def topr(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    advantage_threshold: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """TOPR (Tapered Off-Policy REINFORCE): ``-sg(alpha) * A * logprobs``.

    ``alpha = clip(pi / pi_old, 0, 1)`` for tokens with ``A <= advantage_threshold`` and 1 otherwise: positive
    samples get the plain SFT-like gradient, negative ones a truncated importance weight.
    """
    ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()
    alpha = torch.where(advantages <= advantage_threshold, ratio.clamp(0.0, 1.0), torch.ones_like(ratio))
    loss = agg_loss(-alpha * advantages * logprobs, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "topr_alpha_mean": masked_mean(alpha, mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }


@register_policy_loss("opmd")
def opmd(
    *,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """OPMD / AsymRE loss: ``agg(-A * logprobs) / (1 + tau)`` (no importance weight; ``tau`` regularizes)."""
    loss = agg_loss(-advantages * logprobs, mask, loss_agg_mode, norm_constant) / (1.0 + tau)
    return loss, {"pg_loss": loss.item()}


_REC_CLIP_MODES = ("none", "one-side", "two-side", "ring")
_REC_WEIGHTS = ("none", "importance_sampling", "advantage")
_REC_REGULARIZERS = ("none", "k2", "forward-kl")


@register_policy_loss("rec")
def rec(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    epsilon_low_prime: float,
    epsilon_high_prime: float,
    clip_mode: str,
    weight: str,
    regularizer: str,
    regularizer_coef: float,
    temp: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """REC family (group-relative REINFORCE with optional clipping, weighting and regularization).

    Per token ``-w * A * logprobs * keep``, where (``r = pi / pi_old``, no gradient):

    - ``clip_mode`` decides ``keep``: ``none`` (all), ``two-side`` (``1 - eps_low <= r <= 1 + eps_high``),
      ``one-side`` (``r <= 1 + eps_high`` when ``A >= 0``; ``r >= 1 - eps_low`` when ``A <= 0``),
      ``ring`` (two-side, plus ``r <= 1 - eps_low'`` for ``A >= 0``, ``r >= 1 + eps_high'`` for ``A <= 0``).
    - ``weight``: ``none`` (1), ``importance_sampling`` (``r``), ``advantage`` (``exp(A / temp)``).
    - ``regularizer``: ``k2`` adds ``coef * (logprobs - old_logprobs)**2``;
      ``forward-kl`` adds ``-coef * logprobs``.
    """
    if clip_mode not in _REC_CLIP_MODES:
        raise ValueError(f"rec clip_mode must be one of {_REC_CLIP_MODES}, got {clip_mode!r}")
    if weight not in _REC_WEIGHTS:
        raise ValueError(f"rec weight must be one of {_REC_WEIGHTS}, got {weight!r}")
    if regularizer not in _REC_REGULARIZERS:
        raise ValueError(f"rec regularizer must be one of {_REC_REGULARIZERS}, got {regularizer!r}")
    ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()
    pos, neg = advantages >= 0, advantages <= 0
    two_side = (ratio >= 1 - epsilon_low) & (ratio <= 1 + epsilon_high)
    if clip_mode == "two-side":
        keep = two_side
    elif clip_mode == "one-side":
        keep = (pos & (ratio <= 1 + epsilon_high)) | (neg & (ratio >= 1 - epsilon_low))
    elif clip_mode == "ring":
        keep = two_side | (pos & (ratio <= 1 - epsilon_low_prime)) | (neg & (ratio >= 1 + epsilon_high_prime))
    else:
        keep = torch.ones_like(ratio, dtype=torch.bool)
    if weight == "importance_sampling":
        w = ratio
    elif weight == "advantage":
        w = torch.exp(advantages / temp)
    else:
        w = torch.ones_like(ratio)
    per_token = -w * advantages * logprobs * keep.to(logprobs.dtype)
    if regularizer == "k2":
        per_token = per_token + regularizer_coef * (logprobs - old_logprobs).square()
    elif regularizer == "forward-kl":
        per_token = per_token - regularizer_coef * logprobs
    loss = agg_loss(per_token, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "pg_clipfrac": masked_mean((~keep).float(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }
