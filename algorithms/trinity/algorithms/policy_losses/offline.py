"""Losses on fixed data: SFT (plain and CHORD's phi-weighted) and DPO."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..aggregation import PAIR_MEAN, agg_loss, masked_sum
from ..registry import register_policy_loss
from .common import PolicyLossOutput


@register_policy_loss("sft")
def sft(
    *, logprobs: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str, norm_constant: float | None
) -> PolicyLossOutput:
    """Negative log-likelihood of the target tokens: ``agg(-logprobs)``."""
    loss = agg_loss(-logprobs, mask, loss_agg_mode, norm_constant)
    return loss, {"sft_loss": loss.item()}


@register_policy_loss("sft_phi")
def sft_phi(
    *, logprobs: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str, norm_constant: float | None
) -> PolicyLossOutput:
    """CHORD's token-weighted SFT: ``agg(-sg(p (1 - p)) * logprobs)`` with ``p = exp(logprobs)``.

    ``p (1 - p)`` down-weights tokens the policy already finds certain (p ~ 1) and tokens it finds
    implausible (p ~ 0), so expert data shapes the policy without overwriting it.
    """
    p = logprobs.detach().exp()
    loss = agg_loss(-(p * (1.0 - p)) * logprobs, mask, loss_agg_mode, norm_constant)
    return loss, {"sft_loss": loss.item()}


@register_policy_loss("dpo")
def dpo(
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    label_smoothing: float,
) -> PolicyLossOutput:
    """DPO on rows in (chosen, rejected) pairs: rows 0/1, 2/3, ... .

    Per-token ``logprobs``/``ref_logprobs`` are summed over ``mask`` per row; with
    ``h = (chosen - ref_chosen) - (rejected - ref_rejected)`` the loss is the mean over pairs of
    ``-(1 - ls) log sigmoid(beta h) - ls log sigmoid(-beta h)`` (``ls = label_smoothing``, conservative DPO).
    """
    if logprobs.shape[0] % 2:
        raise ValueError(f"DPO needs an even number of rows in (chosen, rejected) pairs, got batch={logprobs.shape[0]}")
    seq = masked_sum(logprobs, mask, dim=-1)
    ref = masked_sum(ref_logprobs, mask, dim=-1).detach()
    chosen, rejected = seq[0::2] - ref[0::2], seq[1::2] - ref[1::2]
    margin = chosen - rejected
    losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * margin) - label_smoothing * F.logsigmoid(-beta * margin)
    loss = agg_loss(losses, mask, PAIR_MEAN)
    return loss, {
        "dpo_loss": loss.item(),
        "chosen_reward": (beta * chosen.detach()).mean().item(),
        "rejected_reward": (beta * rejected.detach()).mean().item(),
        "accuracy": (chosen.detach() > rejected.detach()).float().mean().item(),
    }
