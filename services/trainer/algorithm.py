"""The algorithm a backend trains with: callables from `trinity.algorithms`, resolved from a preset name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity.trainer.config import TrainerSettings

DATA_KINDS = ("rollout", "sft", "preference")


@dataclass(frozen=True)
class AlgorithmParts:
    """What one train step needs from the algorithm library.

    advantage: `(rewards=[batch], mask=[batch, seq], group_ids=[batch], ...) -> (advantages, returns|None)`;
    policy_loss: `(logprobs=, old_logprobs=, advantages=, mask=, ref_logprobs=) -> (loss, metrics)`;
    kl: `(logprobs, ref_logprobs) -> [batch, seq]`; the trainer adds `kl_coef * agg(kl)` to the loss
    (the KL-in-loss form of GRPO) and reports its mean.
    """

    data_kind: str
    advantage: Callable[..., Any] | None = None
    policy_loss: Callable[..., Any] | None = None
    kl: Callable[..., Any] | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    needs_reference: bool = False
    needs_critic: bool = False
    needs_teacher: bool = False
    loss_agg_mode: str = "token-mean"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.data_kind not in DATA_KINDS:
            raise ValueError(f"data_kind must be one of {DATA_KINDS}, got {self.data_kind!r}")
        if self.data_kind == "rollout" and (self.advantage is None or self.policy_loss is None):
            raise ValueError("a rollout algorithm needs an advantage function and a policy loss")


def _first(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def resolve_algorithm(settings: TrainerSettings) -> AlgorithmParts:
    """Build the parts of `settings.algorithm` from `trinity.algorithms`, applying the settings' overrides."""
    import trinity.algorithms as alg

    p = alg.preset(settings.algorithm)
    over = settings.algorithm_overrides
    data_kind = _first(p, "data_kind", default="rollout")
    adv_name = _first(p, "advantage_fn", "advantage")
    loss_name = _first(p, "policy_loss_fn", "policy_loss")
    kl_name = _first(p, "kl_fn", "kl_penalty_fn", "kl")

    loss_over = dict(_first(p, "policy_loss_args", "policy_loss_kwargs", default={}) or {})
    loss_over.update(over.get("policy_loss", {}))
    adv_over = dict(_first(p, "advantage_args", "advantage_kwargs", default={}) or {})
    adv_over.update(over.get("advantage", {}))
    kl_over = dict(over.get("kl", {}))

    kl_coef = settings.kl_coef
    if kl_coef is None:
        kl_coef = float(_first(p, "kl_coef", "kl_loss_coef", default=0.0) or 0.0)
    entropy_coef = settings.entropy_coef
    if entropy_coef is None:
        entropy_coef = float(_first(p, "entropy_coef", default=0.0) or 0.0)

    policy_loss = alg.policy_loss(loss_name, **loss_over) if data_kind == "rollout" and loss_name else None
    params = getattr(policy_loss, "params", {}) or {}
    return AlgorithmParts(
        data_kind=data_kind,
        advantage=alg.advantage(adv_name, **adv_over) if data_kind == "rollout" and adv_name else None,
        policy_loss=policy_loss,
        kl=alg.kl(kl_name, **kl_over) if kl_name else None,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        needs_reference=bool(_first(p, "needs_reference", default=False)) or data_kind == "preference",
        needs_critic=bool(_first(p, "needs_critic", default=False)),
        needs_teacher=bool(_first(p, "needs_teacher", default=False)),
        loss_agg_mode=str(params.get("loss_agg_mode", "token-mean")),
    )
