"""Entropy bonus terms: ``loss = -entropy_coef * agg(entropy)`` (subtracting entropy rewards exploration).

Every term is called with keyword tensors ``mask [batch, seq]`` and either ``entropies [batch, seq]``
(per-token entropies the trainer already has) or ``logits [batch, seq, vocab]``, and returns
``(loss, metrics)``.
"""

from __future__ import annotations

import torch

from .aggregation import agg_loss
from .registry import register_entropy


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of ``softmax(logits)``: ``[batch, seq, vocab] -> [batch, seq]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1).to(logits.dtype)


def _token_entropies(entropies: torch.Tensor | None, logits: torch.Tensor | None) -> torch.Tensor:
    if entropies is not None:
        return entropies
    if logits is not None:
        return entropy_from_logits(logits)
    raise TypeError("an entropy term needs `entropies` [batch, seq] or `logits` [batch, seq, vocab]")


@register_entropy("none")
def no_entropy(*, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    return torch.zeros((), device=mask.device), {}


@register_entropy("default")
def default_entropy(
    *,
    mask: torch.Tensor,
    entropy_coef: float,
    loss_agg_mode: str,
    norm_constant: float | None,
    entropies: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Entropy bonus over all valid tokens."""
    entropy = agg_loss(_token_entropies(entropies, logits), mask, loss_agg_mode, norm_constant)
    return -entropy_coef * entropy, {"entropy": entropy.item()}


@register_entropy("mix")
def mix_entropy(
    *,
    mask: torch.Tensor,
    entropy_coef: float,
    loss_agg_mode: str,
    norm_constant: float | None,
    entropies: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    expert_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Entropy bonus on the policy's own rollouts only: rows with ``expert_mask [batch]`` true are skipped
    (CHORD mixes expert demonstrations whose entropy the policy should not be rewarded for)."""
    per_token = _token_entropies(entropies, logits)
    if expert_mask is not None:
        mask = mask.bool() & ~expert_mask.bool().unsqueeze(-1)
    entropy = agg_loss(per_token, mask, loss_agg_mode, norm_constant)
    return -entropy_coef * entropy, {"entropy": entropy.item()}
