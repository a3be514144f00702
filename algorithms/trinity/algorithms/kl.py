"""Per-token KL estimators, the KL loss term, the KL reward penalty and the KL coefficient controllers.

Every estimator maps ``(logprobs, ref_logprobs)`` (both ``[batch, seq]``, log-probabilities of the sampled
tokens under the policy and the reference) to a per-token estimate of ``KL(pi || pi_ref)``, ``[batch, seq]``.
With ``d = logprobs - ref_logprobs`` (Schulman's "Approximating KL divergence" notation):

- ``k1``: ``d`` (unbiased, high variance, can be negative),
- ``k2``: ``d**2 / 2``,
- ``k3``: ``exp(-d) + d - 1`` (unbiased, always >= 0),
- ``low_var_kl``: ``k3`` with ``-d`` clamped to [-20, 20] and the result to [-10, 10] (as verl),
- ``abs``: ``|d|``,
- ``none``: zeros (lets a preset say "no KL" by name).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import agg_loss, masked_mean
from .registry import KL_ESTIMATORS, register_kl


@register_kl("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


@register_kl("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs).square()


@register_kl("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


@register_kl("low_var_kl")
def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, *, clamp: float) -> torch.Tensor:
    # The inner clamp keeps exp() finite; the outer one bounds the rare huge estimates that make k3 noisy.
    log_ratio = torch.clamp(ref_logprobs - logprobs, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, min=-clamp, max=clamp)


@register_kl("abs")
def abs_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - ref_logprobs).abs()


@register_kl("none")
def no_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(logprobs)


def kl_loss(
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str = "k2",
    coef: float = 0.001,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL as a loss term: ``coef * agg(kl_estimator(logprobs, ref_logprobs))``.

    Args:
        logprobs, ref_logprobs, mask: ``[batch, seq]``.
    Returns:
        ``(loss, {"kl_loss": ..., "kl": ..., "kl_coef": ...})``; ``kl`` is the unscaled aggregated estimate.
    """
    per_token = KL_ESTIMATORS.build(estimator)(logprobs, ref_logprobs)
    kl_value = agg_loss(per_token, mask, loss_agg_mode)
    loss = coef * kl_value
    return loss, {"kl_loss": loss.item(), "kl": kl_value.item(), "kl_coef": float(coef)}


def apply_kl_penalty(
    *,
    token_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL as a reward penalty: ``token_rewards - coef * kl`` on valid tokens (as verl's ``apply_kl_penalty``).

    Args:
        token_rewards, logprobs, ref_logprobs, mask: ``[batch, seq]``.
        coef: the penalty coefficient, typically ``controller.value``.
    Returns:
        ``(penalized token rewards [batch, seq], {"kl": batch KL (mean over rows of per-row token means),
        "kl_coef": coef})``. Feed ``metrics["kl"]`` to ``controller.update``.
    """
    per_token = KL_ESTIMATORS.build(estimator)(logprobs, ref_logprobs).detach()
    penalized = torch.where(mask.bool(), token_rewards - coef * per_token, token_rewards)
    row_kl = masked_mean(per_token, mask, dim=-1)
    current = masked_mean(row_kl, mask.bool().any(dim=-1))
    return penalized, {"kl": current.item(), "kl_coef": float(coef)}


@dataclass
class FixedKLController:
    """A constant KL coefficient (``update`` is a no-op)."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps


@dataclass
class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 (as in verl/TRL).

    After a batch of ``n_steps`` samples with measured ``current_kl``, the coefficient is multiplied by
    ``1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``: it grows when the policy
    drifts further than ``target_kl`` from the reference and shrinks when it stays closer.
    """

    value: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(
                f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got {self.target_kl}, {self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def kl_controller(
    kind: str = "fixed", *, kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """Build a KL coefficient controller: ``"fixed"`` or ``"adaptive"``."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; known: adaptive, fixed")
