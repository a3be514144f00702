"""Masked reductions and the one loss-aggregation helper every loss shares (verl semantics).

Masks are boolean ``[batch, seq]`` (a float 0/1 mask is accepted and cast). Values at masked positions
are never read arithmetically: they are replaced by zero with ``torch.where`` first, so padding that
holds ``-inf`` or NaN (common for log-probabilities) cannot leak into a loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trinity.registry import Registry
from trinity.registry_names import KINDS


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation mode as ``numerator(loss, mask) / denominator(mask, norm_constant)``.

    The numerator is a sum of per-row terms, so the loss of a mini-batch split into micro-batches is the sum of the
    micro-batches' own losses, each weighted by ``denominator(micro) / denominator(mini)`` (`loss_share`): one
    definition serves the loss and the micro-batch scaling, for a plugin's mode as for the built-in ones.
    """

    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (loss [batch, seq], bool mask) -> scalar
    denominator: Callable[[torch.Tensor, float | None], torch.Tensor | float]  # (bool mask, norm_constant) -> > 0


LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("loss_agg_mode")
PAIR_MEAN = "pair-mean"  # DPO's mean over (chosen, rejected) row pairs: not a choice for token losses
# The built-in modes of token losses.
LOSS_AGG_MODES: tuple[str, ...] = tuple(m for m in KINDS["loss_agg_mode"].builtins if m != PAIR_MEAN)


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_fill_zero(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` else 0 (gradient-safe even when masked values are inf/NaN)."""
    return torch.where(as_bool_mask(mask), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` over positions where ``mask`` is true; ``dim=None`` sums everything."""
    filled = masked_fill_zero(values, mask)
    return filled.sum() if dim is None else filled.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked positions; 0 (not NaN) where nothing is unmasked.

    Args:
        values: ``[batch, seq]`` (any shape matching ``mask``).
        mask: same shape, boolean.
        dim: reduce one dimension (e.g. ``-1`` gives a per-row ``[batch]`` mean) or all (``None``).
    """
    count = as_bool_mask(mask).to(values.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked positions (Bessel-corrected by default); 0 with fewer than 2 positions."""
    mean = masked_mean(values, mask)
    n = as_bool_mask(mask).sum().to(values.dtype)
    sq = masked_sum((values - mean) ** 2, mask)
    denom = (n - 1) if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with batch statistics over masked positions (as verl).

    Returns zeros at masked positions. With ``shift_mean=False`` the mean is added back.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return masked_fill_zero(whitened, mask)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[batch, seq]`` to a scalar.

    Modes (registered `Aggregation`s; ``n_i`` = valid tokens of row ``i``, ``B'`` = rows with at least one valid token):

    - ``token-mean``: ``sum_i sum_t l_it / sum_i n_i`` (every token weighs the same).
    - ``seq-mean-token-mean``: ``mean_{i in B'} (sum_t l_it / n_i)`` (every sequence weighs the same).
    - ``seq-mean-token-sum``: ``mean_{i in B'} sum_t l_it``.
    - ``seq-mean-token-sum-norm``: ``sum_i sum_t l_it / norm_constant`` (Dr. GRPO); the constant
      defaults to ``seq`` (the padded length), so the loss does not depend on response lengths.

    Fully masked rows contribute nothing and never produce NaN; an all-masked batch gives 0.
    """
    agg = LOSS_AGGREGATIONS.get(mode)
    mask = as_bool_mask(mask)
    return agg.numerator(loss_mat, mask) / agg.denominator(mask, norm_constant)


def loss_share(mode: str, micro_mask: torch.Tensor, mini_mask: torch.Tensor, norm_constant: float | None) -> float:
    """The weight of a micro-batch's own aggregated loss in its mini-batch's: the ratio of their denominators.

    Masks ``[rows, resp]`` padded as their batches are (a micro-batch pads to its own longest row)."""
    agg = LOSS_AGGREGATIONS.get(mode)
    part = agg.denominator(as_bool_mask(micro_mask), norm_constant)
    whole = agg.denominator(as_bool_mask(mini_mask), norm_constant)
    return float(part) / float(whole)


def _tokens(mask: torch.Tensor, _: float | None) -> torch.Tensor:
    return mask.sum().clamp(min=1)


def _rows(mask: torch.Tensor, _: float | None) -> torch.Tensor:
    # Rows that have tokens: an empty row must not dilute the loss of the others.
    return mask.any(dim=-1).sum().clamp(min=1)


def _norm_constant(mask: torch.Tensor, norm: float | None) -> float:
    constant = float(mask.shape[-1]) if norm is None else float(norm)
    if constant <= 0:
        raise ValueError(f"seq-mean-token-sum-norm needs a positive norm_constant, got {constant}")
    return constant


def _row_means(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(masked_mean(loss, mask, dim=-1), mask.any(dim=-1))


LOSS_AGGREGATIONS.register("token-mean")(Aggregation(masked_sum, _tokens))
LOSS_AGGREGATIONS.register("seq-mean-token-mean")(Aggregation(_row_means, _rows))
LOSS_AGGREGATIONS.register("seq-mean-token-sum")(Aggregation(masked_sum, _rows))
LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")(Aggregation(masked_sum, _norm_constant))
# Per-pair losses `[pairs]` over rows in (chosen, rejected) pairs.
LOSS_AGGREGATIONS.register(PAIR_MEAN)(Aggregation(lambda loss, _: loss.sum(), lambda mask, _: mask.shape[0] / 2))
