"""The KL coefficient a run trains with: the preset's (or the config's) value, fixed or adapted every step.

One coefficient is controlled: the KL penalty's in the reward when the run has one, else the KL loss
term's. The adaptive controller (Ziegler et al. 2019, `trinity.algorithms.AdaptiveKLController`) reads the
KL the step measured: the penalty's batch KL of the sampled log-probs against the reference (computed
before any update), or the KL term's mean over the step's micro-batches. Both are the same number on every
rank (the prepared batch is whole on each; metrics are merged across ranks), so every rank keeps the same
coefficient without exchanging it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import trinity.algorithms as alg
from trinity.config import AlgorithmConfig
from trinity.trainer.algorithm import AlgorithmParts

Target = Literal["penalty", "loss"]


class KLCoefficient:
    """The controlled coefficient of `parts`; `apply` gives the parts of the next step, `update` adapts."""

    def __init__(self, parts: AlgorithmParts, config: AlgorithmConfig) -> None:
        self.target: Target | None = "penalty" if parts.kl_penalty else ("loss" if parts.kl is not None else None)
        initial = parts.kl_penalty_coef if self.target == "penalty" else parts.kl_coef
        if config.kl_controller == "adaptive" and (self.target is None or initial <= 0):
            raise ValueError(
                f"algorithm.kl_controller: 'adaptive' needs a KL term with a positive coefficient, but "
                f"{config.algorithm_type!r} here has {'none' if self.target is None else f'coefficient {initial}'}"
                " (set kl_coef, or kl_penalty and kl_penalty_coef)"
            )
        self.controller = alg.kl_controller(
            config.kl_controller, kl_coef=initial, target_kl=config.kl_target, horizon=config.kl_horizon
        )

    @property
    def value(self) -> float:
        return float(self.controller.value)

    @value.setter
    def value(self, coef: float) -> None:
        self.controller.value = coef

    def apply(self, parts: AlgorithmParts) -> AlgorithmParts:
        """`parts` with the current coefficient in place of the controlled one."""
        if self.target == "penalty":
            return replace(parts, kl_penalty_coef=self.value)
        if self.target == "loss":
            return replace(parts, kl_coef=self.value)
        return parts

    def update(self, metrics: dict[str, float], samples: int) -> None:
        """Adapt to the KL the step measured (`metrics` of the step), after `samples` samples."""
        measured = metrics.get("kl_penalty" if self.target == "penalty" else "kl")
        if measured is not None:
            self.controller.update(measured, samples)
