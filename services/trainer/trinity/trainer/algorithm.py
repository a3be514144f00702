"""The algorithm a backend trains with: bound callables from `trinity.algorithms`, built from a preset."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trinity.config import AlgorithmConfig

DATA_KINDS = ("rollout", "sft", "preference")
Fn = Callable[..., Any]


def agg_mode(fn: Fn | None, default: str = "token-mean") -> str:
    """The `loss_agg_mode` a bound library function was built with."""
    params = getattr(fn, "params", None) or {}
    return str(params.get("loss_agg_mode", default))


@dataclass(frozen=True)
class AlgorithmParts:
    """What one train step needs from the algorithm library (see `trinity.algorithms` for contracts).

    advantage: `(rewards=[batch], mask=, group_ids=, ...) -> (advantages [batch, seq], returns | None)`, or
    None for rollouts trained without one (RAFT: SFT on the rewarded samples);
    policy_loss: `(logprobs=, old_logprobs=, advantages=, mask=, ref_logprobs=) -> (loss, metrics)`;
    entropy: `(mask=, entropies=) -> (loss, metrics)`; value_loss: `(values=, old_values=, returns=, mask=)`;
    kl: per-token estimator for the KL loss term `kl_coef * agg(kl)`; kl_penalty: estimator subtracted
    (times `kl_penalty_coef`) from the token rewards before advantages.
    """

    data_kind: str
    policy_loss: Fn
    advantage: Fn | None = None
    entropy: Fn | None = None
    value_loss: Fn | None = None
    kl: Fn | None = None
    kl_coef: float = 0.0
    kl_penalty: str | None = None
    kl_penalty_coef: float = 0.0
    needs_reference: bool = False
    needs_critic: bool = False
    needs_teacher: bool = False
    required_inputs: tuple[str, ...] = ()  # per-row advantage inputs a batch must carry (see `objectives`)

    def __post_init__(self) -> None:
        if self.data_kind not in DATA_KINDS:
            raise ValueError(f"data_kind must be one of {DATA_KINDS}, got {self.data_kind!r}")
        if self.needs_critic and self.value_loss is None:
            raise ValueError("an algorithm with a critic needs a value loss")

    @property
    def loss_agg_mode(self) -> str:
        return agg_mode(self.policy_loss)


def resolve_algorithm(config: AlgorithmConfig) -> AlgorithmParts:
    """Build the parts of preset `config.algorithm_type`, applying the section's overrides."""
    import trinity.algorithms as alg

    p = alg.preset(config.algorithm_type)
    entropy_over = dict(config.entropy)
    if config.entropy_coef is not None and p.entropy != "none":
        entropy_over["entropy_coef"] = config.entropy_coef
    kl_coef = p.kl_loss_coef if config.kl_coef is None else config.kl_coef
    kl_coef = float(kl_coef) if p.kl_loss != "none" else 0.0
    penalty = p.kl_penalty if config.kl_penalty is None else config.kl_penalty
    penalty_coef = p.kl_penalty_coef if config.kl_penalty_coef is None else config.kl_penalty_coef
    if penalty != "none" and p.data_kind != "rollout":
        raise ValueError(f"algorithm.kl_penalty: {p.name!r} trains on {p.data_kind} data, which has no rewards")
    if p.needs_teacher and not config.teacher_model:
        raise ValueError(f"algorithm.teacher_model: {p.name!r} distills from a teacher; give its model directory")
    # A zero KL weight makes the reference model dead weight (a whole extra forward pass); skip it.
    needs_reference = (p.needs_reference and (kl_coef > 0 or p.data_kind == "preference")) or penalty != "none"
    return AlgorithmParts(
        data_kind=p.data_kind,
        policy_loss=p.build_policy_loss(**config.policy_loss),
        advantage=p.build_advantage(**config.advantage),
        entropy=p.build_entropy(**entropy_over) if p.entropy != "none" else None,
        value_loss=p.build_value_loss(**config.value_loss),
        kl=p.build_kl_loss() if p.kl_loss != "none" else None,
        kl_coef=kl_coef,
        kl_penalty=penalty if penalty != "none" else None,
        kl_penalty_coef=float(penalty_coef),
        needs_reference=needs_reference,
        needs_critic=p.needs_critic,
        needs_teacher=p.needs_teacher,
        required_inputs=tuple(p.required_inputs),
    )
