"""Importance-ratio policy losses: PPO (dual-clip), GSPO, CISPO, SAPO, sPPO."""

from __future__ import annotations

import torch

from ..aggregation import agg_loss, masked_mean
from ..registry import register_policy_loss
from .common import PolicyLossOutput, approx_kl, log_ratio, resolve_clip


def ppo_surrogate(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """Dual-clip PPO surrogate, the core shared by ``ppo`` and ``mix_chord``.

    Per token, with ``r = exp(logprobs - old_logprobs)`` and ``A`` the advantage:
    ``l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` additionally
    ``l = min(l, -A * clip_ratio_c)`` (dual clip: bounds the loss of a negative-advantage token whose ratio
    exploded, Ye et al. 2020).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    upper = torch.maximum(unclipped, clipped)
    dual = torch.minimum(upper, -advantages * clip_ratio_c)
    per_token = torch.where(advantages < 0, dual, upper)
    loss = agg_loss(per_token, mask, loss_agg_mode, norm_constant)
    lower_clipped = (upper > -advantages * clip_ratio_c) & (advantages < 0)
    return loss, {
        "pg_loss": loss.item(),
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask).item(),
        "pg_clipfrac_lower": masked_mean(lower_clipped.float(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }


@register_policy_loss("ppo")
def ppo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
    clip_range_low: float | None,
    clip_range_high: float | None,
    clip_ratio_c: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """PPO clipped surrogate with dual clip (also GRPO's and DAPO's loss; DAPO sets low/high 0.2/0.28)."""
    low, high = resolve_clip(clip_range, clip_range_low, clip_range_high)
    return ppo_surrogate(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        clip_low=low,
        clip_high=high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        norm_constant=norm_constant,
    )


@register_policy_loss("gspo")
def gspo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
    clip_range_low: float | None,
    clip_range_high: float | None,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """GSPO-token (Zheng et al. 2025): clip a *sequence*-level ratio.

    ``s_i = exp(mean_t log(pi / pi_old))`` over the row's valid tokens. Each token uses
    ``s_it = sg(s_i) * pi_t / sg(pi_t)``: its value is ``s_i`` while its gradient flows through its own
    token, so ``grad = s_i * grad log pi_t``. The loss per token is the PPO max of ``-A s_it`` and
    ``-A clip(s_it, 1 - low, 1 + high)``, aggregated ``seq-mean-token-mean`` by default.
    """
    low, high = resolve_clip(clip_range, clip_range_low, clip_range_high)
    seq_log_ratio = masked_mean(logprobs - old_logprobs, mask, dim=-1)  # [batch]
    token_log_ratio = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    loss = agg_loss(torch.maximum(unclipped, clipped), mask, loss_agg_mode, norm_constant)
    rows = mask.bool().any(dim=-1)
    return loss, {
        "pg_loss": loss.item(),
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
        "ppo_kl_seq": masked_mean(-seq_log_ratio.detach(), rows).item(),
    }


@register_policy_loss("cispo")
def cispo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range_low: float,
    clip_range_high: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """CISPO (MiniMax-M1): clip the importance weight, not the update.

    Per token ``-A * sg(clip(r, 1 - low, 1 + high)) * logprobs``: every token keeps a gradient (scaled by the
    clipped weight), unlike PPO which drops clipped tokens. ``low = 1.0`` means no lower bound.
    """
    ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()
    weight = torch.clamp(ratio, 1.0 - clip_range_low, 1.0 + clip_range_high)
    loss = agg_loss(-advantages * weight * logprobs, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "pg_clipfrac": masked_mean((weight != ratio).float(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }


@register_policy_loss("sapo")
def sapo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """SAPO (Gao et al. 2025): a soft, temperature-controlled gate instead of a hard clip.

    Per token ``-A * f(r)`` with ``f(r) = sigmoid(tau (r - 1)) * 4 / tau`` and ``tau = tau_pos`` if ``A > 0``
    else ``tau_neg``. Its gradient is ``-A * 4 sigma (1 - sigma) * r * grad log pi``: equal to the plain
    policy gradient on-policy (``r = 1``), decaying smoothly as ``r`` leaves 1 (faster when ``A < 0``).
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be positive, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    loss = agg_loss(-advantages * gate, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "sapo_gate_mean": masked_mean(gate.detach(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }


@register_policy_loss("sppo")
def sppo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """sPPO: ``-A * log(pi / pi_old)`` on tokens with ratio in ``[1 / (1 + eps), 1 + eps]``, 0 elsewhere.

    The log-ratio replaces PPO's ratio, giving the plain policy gradient inside the trust region.
    """
    ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()
    in_range = (ratio >= 1.0 / (1.0 + epsilon)) & (ratio <= 1.0 + epsilon)
    per_token = -advantages * (logprobs - old_logprobs) * in_range.to(logprobs.dtype)
    loss = agg_loss(per_token, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "pg_clipfrac": masked_mean((~in_range).float(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }
