"""MIX and CHORD (``mix``, ``mix_chord``): one loss over a batch mixing the policy's rollouts and expert
demonstrations."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..registry import register_policy_loss
from .clipped import ppo_surrogate
from .common import PolicyLossOutput, resolve_clip
from .offline import sft, sft_phi


def chord_mu_schedule(step: int, warmup_steps: int, decay_steps: int, peak: float, valley: float) -> float:
    """Weight ``mu`` of the SFT term at training ``step``: linear warmup 0 -> ``peak`` over ``warmup_steps``,
    then cosine decay ``peak`` -> ``valley`` over ``decay_steps``, then ``valley``."""
    if step < warmup_steps:
        return step / warmup_steps * peak
    if step >= warmup_steps + decay_steps:
        return valley
    progress = (step - warmup_steps) / decay_steps
    return valley + (peak - valley) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _mix_rl_and_sft(
    mu: float,
    sft_fn: Callable[..., PolicyLossOutput],
    sft_agg_mode: str,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    expert_mask: torch.Tensor,
    clip: tuple[float, float],
    clip_ratio_c: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """``(1 - mu) * PPO(rollout rows) + mu * sft_fn(expert rows)``, the core of ``mix`` and ``mix_chord``.

    A side with no rows contributes 0. Unlike Trinity-RFT the two terms are not rescaled by micro-batch
    bookkeeping: that is the trainer's job; this only mixes the two per-row-set losses.
    """
    expert = expert_mask.bool()
    if expert.shape != logprobs.shape[:1]:
        raise ValueError(f"expert_mask must be [batch]={logprobs.shape[0]}, got {tuple(expert.shape)}")
    metrics: dict[str, float] = {"mu": mu}
    zero = logprobs.sum() * 0.0  # keeps the graph connected when a side is empty
    rl_loss, sft_loss = zero, zero
    usual = ~expert
    if usual.any():
        rl_loss, rl_metrics = ppo_surrogate(
            logprobs=logprobs[usual],
            old_logprobs=old_logprobs[usual],
            advantages=advantages[usual],
            mask=mask[usual],
            clip_low=clip[0],
            clip_high=clip[1],
            clip_ratio_c=clip_ratio_c,
            loss_agg_mode=loss_agg_mode,
            norm_constant=norm_constant,
        )
        metrics.update({f"usual/{k}": v for k, v in rl_metrics.items()})
    if expert.any():
        sft_loss, sft_metrics = sft_fn(
            logprobs=logprobs[expert], mask=mask[expert], loss_agg_mode=sft_agg_mode, norm_constant=norm_constant
        )
        metrics.update({f"expert/{k}": v for k, v in sft_metrics.items()})
    loss = (1.0 - mu) * rl_loss + mu * sft_loss
    metrics["pg_loss"] = loss.item()
    return loss, metrics


@register_policy_loss("mix")
def mix(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    expert_mask: torch.Tensor,
    mu: float,
    clip_range: float | None,
    clip_range_low: float | None,
    clip_range_high: float | None,
    clip_ratio_c: float,
    loss_agg_mode: str,
    sft_loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """MIX: ``(1 - mu) * PPO(rollout rows) + mu * SFT(expert rows)`` with a constant ``mu``.

    The SFT term is the plain NLL, averaged per sequence (``sft_loss_agg_mode``, Trinity-RFT's
    ``use_token_level_loss_in_sft=False``), while the PPO term uses ``loss_agg_mode``.
    """
    return _mix_rl_and_sft(
        mu,
        sft,
        sft_loss_agg_mode,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        expert_mask=expert_mask,
        clip=resolve_clip(clip_range, clip_range_low, clip_range_high),
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        norm_constant=norm_constant,
    )


@register_policy_loss("mix_chord")
def mix_chord(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    expert_mask: torch.Tensor,
    mu_warmup_steps: int,
    mu_decay_steps: int,
    mu_peak: float,
    mu_valley: float,
    enable_phi_function: bool,
    clip_range: float | None,
    clip_range_low: float | None,
    clip_range_high: float | None,
    clip_ratio_c: float,
    loss_agg_mode: str,
    norm_constant: float | None,
    step: int = 0,
) -> PolicyLossOutput:
    """``(1 - mu) * PPO(rollout rows) + mu * SFT(expert rows)``, ``mu = chord_mu_schedule(step, ...)``.

    Args:
        expert_mask: ``[batch]`` bool, true on expert-demonstration rows.
        step: global training step driving the ``mu`` schedule.

    The SFT term is phi-weighted (``sft_phi``) unless ``enable_phi_function=False``.
    """
    mu = chord_mu_schedule(step, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley)
    return _mix_rl_and_sft(
        mu,
        sft_phi if enable_phi_function else sft,
        loss_agg_mode,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        expert_mask=expert_mask,
        clip=resolve_clip(clip_range, clip_range_low, clip_range_high),
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        norm_constant=norm_constant,
    )
