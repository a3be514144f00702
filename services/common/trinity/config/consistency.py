"""`monitor.consistency`: limits on how far the trainer's view of the policy may drift from the sampler's.

The trainer reports its train-vs-rollout probe with every step (`consistency/*` metrics, docs/trainer.md) and the
explorer whether the weights it loaded are the ones published (`digest_match`, docs/weight-sync.md). A limit set here
turns a reading past it into a `warning` event, or with `action: stop` into the failure of the run, one line naming
the metric and the limit. Every limit is off (None) by default: the metrics are always reported.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trinity.config.base import _Section


class ConsistencyConfig(_Section):
    """Limits on the probe's readings; each applies to every train step's value."""

    max_logprob_diff_mean: float | None = Field(
        default=None, gt=0, description="limit on consistency/logprob_diff_mean: mean |trainer - sampler| log-prob"
    )
    max_k3_kl: float | None = Field(
        default=None, gt=0, description="limit on consistency/k3_kl: the k3 estimate of KL(sampler || trainer)"
    )
    max_ratio_outside_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="limit on consistency/ratio_outside_share: the share of tokens whose ratio leaves ratio_band",
    )
    ratio_band: tuple[float, float] = Field(
        default=(0.8, 1.25), description="(low, high) band of exp(trainer - sampler) log-prob counted as consistent"
    )
    action: Literal["warn", "stop"] = Field(
        default="warn",
        description="past a limit, or on a weights digest mismatch: warn (a warning event) or stop (the run fails)",
    )

    @model_validator(mode="after")
    def _band_around_one(self) -> ConsistencyConfig:
        low, high = self.ratio_band
        if not 0 < low < 1 < high:
            raise ValueError(f"ratio_band: ({low}, {high}) must satisfy 0 < low < 1 < high")
        return self
