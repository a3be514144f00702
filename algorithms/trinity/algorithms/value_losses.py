"""Critic (value-function) losses for PPO."""

from __future__ import annotations

import torch

from .aggregation import agg_loss, masked_mean
from .registry import register_value_loss


@register_value_loss("clipped")
def clipped_value_loss(
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss: ``0.5 * agg(max((V - R)^2, (clip(V, V_old +- c) - R)^2))``.

    Args:
        values: ``[batch, seq]`` current critic predictions (with grad).
        old_values: ``[batch, seq]`` critic predictions at rollout time.
        returns: ``[batch, seq]`` regression targets (from GAE).
    """
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    loss_unclipped = (values - returns).square()
    loss_clipped = (clipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), mask, loss_agg_mode, norm_constant)
    return loss, {
        "vf_loss": loss.item(),
        "vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), mask).item(),
    }


@register_value_loss("mse")
def mse_value_loss(
    *,
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Unclipped ``0.5 * agg((V - R)^2)``."""
    loss = 0.5 * agg_loss((values - returns).square(), mask, loss_agg_mode, norm_constant)
    return loss, {"vf_loss": loss.item()}
