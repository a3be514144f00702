"""Unclipped importance-ratio losses: plain importance sampling (IS-PPO) and M2PO's second-moment mask."""

from __future__ import annotations

import torch

from ..aggregation import agg_loss, as_bool_mask, masked_mean
from ..registry import register_policy_loss
from .common import PolicyLossOutput, approx_kl, log_ratio


def _ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """``exp(log(pi / pi_old))`` whose value is clamped like ``log_ratio`` but whose gradient never is.

    A hard clamp would zero the gradient of every token beyond the bound; only the value needs bounding.
    """
    raw = logprobs - old_logprobs
    return torch.exp(raw + (log_ratio(logprobs, old_logprobs) - raw).detach())


@register_policy_loss("importance_sampling")
def importance_sampling(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """Importance-sampling policy gradient (IS-PPO): ``agg(-A * r)``, ``r = pi / pi_old``, no clip.

    Its gradient is ``-A * r * grad log pi``: the off-policy-corrected policy gradient, which PPO's clip
    would cut off for tokens whose ratio left the trust region.
    """
    ratio = _ratio(logprobs, old_logprobs)
    loss = agg_loss(-advantages * ratio, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "ratio/mean": masked_mean(ratio.detach(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }


@torch.no_grad()
def m2po_mask(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """M2PO's token mask (Algorithm 1): the tokens to keep, ``[batch, seq]`` bool.

    Only tokens where PPO's clip could act are candidates (``A > 0`` and ``r > 1``, or ``A < 0`` and
    ``r < 1``). If their mean second moment ``mean((log r)^2)`` exceeds ``threshold``, the candidates with
    the largest ``(log r)^2`` are dropped until the mean of the rest is at most ``threshold``.
    """
    valid = as_bool_mask(mask)
    d = (logprobs - old_logprobs).float()
    candidates = valid & (((advantages > 0) & (d > 0)) | ((advantages < 0) & (d < 0)))
    keep = valid.clone()
    index = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    moments = d.square().reshape(-1)[index]
    if moments.numel() and moments.mean() > threshold:
        ordered, order = torch.sort(moments, stable=True)
        prefix_mean = ordered.cumsum(0) / torch.arange(1, len(ordered) + 1, device=ordered.device)
        n_keep = int((prefix_mean <= threshold).sum())  # prefix means of an ascending list only grow
        keep.view(-1)[index[order[n_keep:]]] = False
    return keep


@register_policy_loss("m2po")
def m2po(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    m2_threshold: float,
    loss_agg_mode: str,
    norm_constant: float | None,
) -> PolicyLossOutput:
    """M2PO (Zheng et al. 2025): the importance-sampling loss on the tokens ``m2po_mask`` keeps.

    The masked tokens still count in the denominator (the paper normalizes by every valid token), so
    masking a token removes its gradient without rescaling the others. The mask is computed over the
    tokens of this call: the trainer's micro-batch, where Trinity-RFT uses the whole mini-batch.
    """
    if not m2_threshold >= 0:
        raise ValueError(f"m2po m2_threshold must be >= 0, got {m2_threshold}")
    keep = m2po_mask(logprobs, old_logprobs, advantages, mask, m2_threshold)
    ratio = _ratio(logprobs, old_logprobs)
    per_token = torch.where(keep, -advantages * ratio, torch.zeros_like(ratio))
    loss = agg_loss(per_token, mask, loss_agg_mode, norm_constant)
    return loss, {
        "pg_loss": loss.item(),
        "m2po_masked_fraction": masked_mean((~keep).float(), mask).item(),
        "ppo_kl": approx_kl(logprobs, old_logprobs, mask),
    }
