"""The train-vs-rollout consistency probe: how far the trainer's log-probs of the sampled tokens are from the
sampler's, read from log-probs the step computes anyway (docs/trainer.md, "Consistency probe").

Per compared token, `d = trainer - sampler` log-prob (the log of the importance ratio `r = exp(d)`):

- `consistency/logprob_diff_mean`, `_max`: mean and max of `|d|`;
- `consistency/k3_kl`: mean of `exp(d) - 1 - d`, the k3 estimate of KL(sampler || trainer) (the tokens were drawn
  from the sampler, and `E_sampler[r] = 1`, so the estimate is unbiased and never negative);
- `consistency/ratio_outside_share`: the share of tokens whose `r` leaves the band (`[0.8, 1.25]` by default).

A step's probe covers the sampled tokens (action mask) of the rows it reads under the weights of before its first
update; `ProbeSums` adds micro-batches and ranks up exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity.config.consistency import ConsistencyConfig

DIFF_MEAN = "consistency/logprob_diff_mean"
DIFF_MAX = "consistency/logprob_diff_max"
K3_KL = "consistency/k3_kl"
OUTSIDE = "consistency/ratio_outside_share"
VERSION_LAG_MAX = "consistency/version_lag_max"
MAXIMA_SUFFIX = "_max"  # metrics that ranks and micro-batches combine by max (`parallel.merge_weighted`)


@dataclass
class ProbeSums:
    """Token sums of one or more micro-batches; `metrics()` turns them into the reported means."""

    tokens: float = 0.0
    abs_diff: float = 0.0
    k3: float = 0.0
    outside: float = 0.0
    max_abs_diff: float = 0.0

    @classmethod
    def of(
        cls, trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, band: tuple[float, float] = (0.8, 1.25)
    ) -> ProbeSums:
        """`trainer`, `sampler`: `[rows, resp]` log-probs of the same tokens; `mask`: `[rows, resp]`, the tokens to
        compare (the sampled ones)."""
        keep = mask.bool().to(trainer.device)
        # float64 and expm1: k3 of a near-zero difference is about d^2 / 2, far below float32's rounding of exp(d)
        d = (trainer.detach().double() - sampler.detach().to(trainer.device).double())[keep]
        if d.numel() == 0:
            return cls()
        ratio = torch.exp(d)
        low, high = band
        return cls(
            tokens=float(d.numel()),
            abs_diff=float(d.abs().sum()),
            k3=float((torch.expm1(d) - d).sum()),
            outside=float(((ratio < low) | (ratio > high)).sum()),
            max_abs_diff=float(d.abs().max()),
        )

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {
            DIFF_MEAN: self.abs_diff / self.tokens,
            DIFF_MAX: self.max_abs_diff,
            K3_KL: self.k3 / self.tokens,
            OUTSIDE: self.outside / self.tokens,
        }

    def add_to(self, sums: dict[str, float], weights: dict[str, float]) -> None:
        """Into a step's micro-batch metrics (`sums`/`weights`): means weighted by tokens, the max by max."""
        if not self.tokens:
            return
        for key, total in ((DIFF_MEAN, self.abs_diff), (K3_KL, self.k3), (OUTSIDE, self.outside)):
            sums[key] = sums.get(key, 0.0) + total
            weights[key] = weights.get(key, 0.0) + self.tokens
        sums[DIFF_MAX] = max(sums.get(DIFF_MAX, 0.0), self.max_abs_diff)
        weights[DIFF_MAX] = 1.0


def breaches(metrics: dict[str, float], config: ConsistencyConfig) -> list[str]:
    """One line per limit of `config` that a step's `metrics` exceed, naming the metric, its value and the limit."""
    limits = {  # metric -> (its limit's field, the limit; None = none)
        DIFF_MEAN: ("max_logprob_diff_mean", config.max_logprob_diff_mean),
        K3_KL: ("max_k3_kl", config.max_k3_kl),
        OUTSIDE: ("max_ratio_outside_share", config.max_ratio_outside_share),
    }
    return [
        f"{metric} {metrics[metric]:.4g} exceeds monitor.consistency.{field} {limit:g}"
        for metric, (field, limit) in limits.items()
        if limit is not None and metric in metrics and metrics[metric] > limit
    ]
