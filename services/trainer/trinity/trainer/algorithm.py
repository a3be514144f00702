"""The algorithm a backend trains with: the library's bound functions, built from the run's resolved algorithm."""

from __future__ import annotations

from dataclasses import dataclass

from trinity.algorithm_table import DataKind, RowInput
from trinity.algorithms import BoundFn
from trinity.config import AlgorithmConfig, resolve_algorithm


def agg_mode(fn: BoundFn | None, default: str = "token-mean") -> str:
    """The `loss_agg_mode` a bound library function was built with."""
    params = fn.params if fn is not None else {}
    return str(params.get("loss_agg_mode", default))


@dataclass(frozen=True)
class AlgorithmParts:
    """What one train step needs from the algorithm library (see `trinity.algorithms` for contracts).

    Each function is called with exactly the inputs its signature names (`BoundFn.inputs`). advantage: None for
    rollouts trained without one (RAFT: SFT on the rewarded samples); kl: the per-token estimator of the KL loss
    term `kl_coef * agg(kl)`; kl_penalty: the estimator subtracted (times `kl_penalty_coef`) from the token rewards
    before advantages.
    """

    data_kind: DataKind
    policy_loss: BoundFn
    advantage: BoundFn | None = None
    entropy: BoundFn | None = None
    value_loss: BoundFn | None = None
    kl: BoundFn | None = None
    kl_coef: float = 0.0
    kl_penalty: str | None = None
    kl_penalty_coef: float = 0.0
    needs_reference: bool = False
    needs_teacher: bool = False
    requires: frozenset[RowInput] = frozenset()  # per-row inputs every batch must carry
    value_loss_coef: float = 1.0  # the critic's loss weight (`trainer.value_loss_coef`)

    @property
    def needs_critic(self) -> bool:
        return self.value_loss is not None

    @property
    def loss_agg_mode(self) -> str:
        return agg_mode(self.policy_loss)


def build_algorithm(config: AlgorithmConfig) -> AlgorithmParts:
    """The bound functions of `config`'s resolved algorithm (`trinity.config.resolve_algorithm`)."""
    import trinity.algorithms as lib

    resolved = resolve_algorithm(config)
    fns = resolved.functions
    builders = {
        "advantage": lib.ADVANTAGES,
        "policy_loss": lib.POLICY_LOSSES,
        "entropy_term": lib.ENTROPY_TERMS,
        "value_loss": lib.VALUE_LOSSES,
    }
    bound = {kind: builders[kind].build(name, **args) for kind, (name, args) in fns.items()}
    preset = resolved.preset
    return AlgorithmParts(
        data_kind=preset.data_kind,
        policy_loss=bound["policy_loss"],
        advantage=bound.get("advantage"),
        entropy=bound.get("entropy_term"),
        value_loss=bound.get("value_loss"),
        kl=lib.KL_ESTIMATORS.build(resolved.kl_loss) if resolved.kl_loss else None,
        kl_coef=resolved.kl_coef,
        kl_penalty=resolved.kl_penalty,
        kl_penalty_coef=resolved.kl_penalty_coef,
        needs_reference=resolved.needs_reference,
        needs_teacher=preset.needs_teacher,
        requires=preset.requires,
    )
