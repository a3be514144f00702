"""Algorithm presets: one per ``algorithm_type`` of the Trinity-RFT table.

A preset only *names* its components (registry names plus hyperparameter overrides) and states what the
rest of the system must provide (reference model, critic, teacher, Buffer operators, data kind). The
trainer builds the callables with ``preset.build_*()``; no tensors or state live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from trinity.registry import Registry

from .registry import ADVANTAGES, ENTROPY_TERMS, KL_ESTIMATORS, POLICY_LOSSES, VALUE_LOSSES, BoundFn

DataKind = Literal["rollout", "sft", "preference"]
DATA_KINDS: tuple[str, ...] = ("rollout", "sft", "preference")

_ARG_FIELDS = ("advantage_args", "policy_loss_args", "entropy_args", "value_loss_args")


@dataclass(frozen=True)
class AlgorithmPreset:
    """A named composition of registered components with its defaults and requirements.

    Attributes:
        name: the ``algorithm_type`` string.
        policy_loss / advantage / entropy / value_loss: registry names (``advantage`` and ``value_loss`` may
            be ``None`` for algorithms without them, e.g. SFT, DPO).
        *_args: hyperparameter overrides on top of the registered defaults (read-only mappings).
        kl_loss / kl_loss_coef: KL estimator used as a loss term (``"none"`` for no term) and its weight.
        kl_penalty / kl_penalty_coef: KL estimator subtracted from token rewards (``"none"`` for no penalty).
        needs_reference / needs_critic / needs_teacher: which extra models the trainer must run.
        required_buffer_operators: Buffer operators the data pipeline must apply (e.g. DAPO's dynamic
            sampling ``reward_std_filter``).
        reward_shaping: names of helpers in ``trinity.algorithms.reward_shaping`` the preset expects.
        required_inputs: per-row tensors the components need beyond rewards, mask and group ids, which
            the explorer or trainer must supply (e.g. ReMax's ``reward_baselines``).
        uses_expert_data: the policy loss mixes expert-demonstration rows (``expert_mask``) into RL batches.
        data_kind: ``rollout`` (explored experience), ``sft`` (demonstrations) or ``preference`` (DPO pairs).
        repeat_times: default rollouts per task (the group size for group-relative advantages).
    """

    name: str
    description: str
    policy_loss: str
    advantage: str | None = None
    entropy: str = "none"
    value_loss: str | None = None
    advantage_args: Mapping[str, Any] = field(default_factory=dict)
    policy_loss_args: Mapping[str, Any] = field(default_factory=dict)
    entropy_args: Mapping[str, Any] = field(default_factory=dict)
    value_loss_args: Mapping[str, Any] = field(default_factory=dict)
    kl_loss: str = "none"
    kl_loss_coef: float = 0.001
    kl_penalty: str = "none"
    kl_penalty_coef: float = 0.0
    needs_reference: bool = False
    needs_critic: bool = False
    needs_teacher: bool = False
    required_buffer_operators: tuple[str, ...] = ()
    reward_shaping: tuple[str, ...] = ()
    required_inputs: tuple[str, ...] = ()
    uses_expert_data: bool = False
    data_kind: DataKind = "rollout"
    repeat_times: int = 1

    def __post_init__(self) -> None:
        for name in _ARG_FIELDS:  # freeze the argument mappings too, not only the attributes
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        if self.data_kind not in DATA_KINDS:
            raise ValueError(f"preset {self.name!r}: data_kind must be one of {DATA_KINDS}, got {self.data_kind!r}")
        uses_reference = self.kl_loss != "none" or self.kl_penalty != "none" or self.policy_loss == "dpo"
        if uses_reference != self.needs_reference:
            raise ValueError(
                f"preset {self.name!r}: needs_reference={self.needs_reference} but its components "
                f"{'use' if uses_reference else 'do not use'} reference log-probabilities"
            )
        if (self.value_loss is not None) != self.needs_critic:
            raise ValueError(f"preset {self.name!r}: a value_loss is set exactly when needs_critic is true")

    def build_advantage(self, **overrides: Any) -> BoundFn | None:
        if self.advantage is None:
            return None
        return ADVANTAGES.build(self.advantage, **{**self.advantage_args, **overrides})

    def build_policy_loss(self, **overrides: Any) -> BoundFn:
        return POLICY_LOSSES.build(self.policy_loss, **{**self.policy_loss_args, **overrides})

    def build_entropy(self, **overrides: Any) -> BoundFn:
        return ENTROPY_TERMS.build(self.entropy, **{**self.entropy_args, **overrides})

    def build_value_loss(self, **overrides: Any) -> BoundFn | None:
        if self.value_loss is None:
            return None
        return VALUE_LOSSES.build(self.value_loss, **{**self.value_loss_args, **overrides})

    def build_kl_loss(self) -> BoundFn:
        return KL_ESTIMATORS.build(self.kl_loss)

    def build_kl_penalty(self) -> BoundFn:
        return KL_ESTIMATORS.build(self.kl_penalty)


# The `algorithm_type` names of a config; a package adds one through the entry-point group `trinity.algorithms`.
PRESETS: Registry[AlgorithmPreset] = Registry("algorithm")


def register_preset(preset: AlgorithmPreset) -> AlgorithmPreset:
    """Register ``preset`` under its name (an ``algorithm_type``); a name already taken is an error."""
    return PRESETS.register(preset.name)(preset)


# Group-relative RL with a reference-KL loss: the shape most presets share (Trinity-RFT defaults).
_GROUP_RL: dict[str, Any] = dict(
    advantage="grpo", entropy="default", kl_loss="k2", needs_reference=True, repeat_times=2
)

for _preset in (
    AlgorithmPreset(
        name="ppo",
        description="PPO: GAE advantages from a critic, dual-clip surrogate, clipped value loss",
        policy_loss="ppo",
        advantage="ppo",
        entropy="default",
        value_loss="clipped",
        kl_loss="k2",
        needs_reference=True,
        needs_critic=True,
    ),
    AlgorithmPreset(
        name="grpo", description="GRPO: group-normalized outcome advantages", policy_loss="ppo", **_GROUP_RL
    ),
    AlgorithmPreset(
        name="dapo",
        description="DAPO: clip-higher, token-mean loss, dynamic sampling, overlong reward shaping, no KL",
        policy_loss="ppo",
        advantage="grpo",
        entropy="default",
        policy_loss_args={"clip_range_low": 0.2, "clip_range_high": 0.28, "loss_agg_mode": "token-mean"},
        required_buffer_operators=("reward_std_filter",),
        reward_shaping=("overlong_reward_penalty",),
        repeat_times=16,
    ),
    AlgorithmPreset(name="gspo", description="GSPO: sequence-level clipped ratio", policy_loss="gspo", **_GROUP_RL),
    AlgorithmPreset(
        name="rloo",
        description="RLOO: leave-one-out baseline",
        policy_loss="ppo",
        **{**_GROUP_RL, "advantage": "rloo"},
    ),
    AlgorithmPreset(
        name="reinforceplusplus",
        description="REINFORCE++: batch-whitened discounted returns",
        policy_loss="ppo",
        **{**_GROUP_RL, "advantage": "reinforceplusplus"},
    ),
    AlgorithmPreset(
        name="sft", description="Supervised fine-tuning on demonstrations", policy_loss="sft", data_kind="sft"
    ),
    AlgorithmPreset(
        name="dpo",
        description="DPO on (chosen, rejected) pairs with a reference model",
        policy_loss="dpo",
        entropy="default",
        kl_loss="k2",
        needs_reference=True,
        data_kind="preference",
        repeat_times=2,
    ),
    AlgorithmPreset(
        name="mix_chord",
        description="CHORD: PPO on rollouts mixed with phi-weighted SFT on expert rows, mu scheduled",
        policy_loss="mix_chord",
        advantage="grpo",
        entropy="mix",
        uses_expert_data=True,
        repeat_times=8,
    ),
    AlgorithmPreset(
        name="rec",
        description="REC: group-relative REINFORCE with optional clipping/weighting",
        policy_loss="rec",
        **{**_GROUP_RL, "advantage": "rec"},
    ),
    AlgorithmPreset(
        name="topr",
        description="TOPR: tapered off-policy REINFORCE",
        policy_loss="topr",
        **{**_GROUP_RL, "advantage": "reinforce"},
    ),
    AlgorithmPreset(
        name="sppo",
        description="sPPO: log-ratio surrogate inside a trust region, OPMD baseline",
        policy_loss="sppo",
        advantage="opmd",
        repeat_times=2,
    ),
    AlgorithmPreset(
        name="asymre",
        description="AsymRE: shifted group baseline, REINFORCE loss",
        policy_loss="opmd",
        advantage="asymre",
        repeat_times=2,
    ),
    AlgorithmPreset(name="cispo", description="CISPO: clipped importance weights", policy_loss="cispo", **_GROUP_RL),
    AlgorithmPreset(name="sapo", description="SAPO: soft-gated ratio", policy_loss="sapo", **_GROUP_RL),
    AlgorithmPreset(
        name="on_policy_distill",
        description="On-policy distillation: per-token teacher - student log-prob advantages",
        policy_loss="ppo",
        advantage="on_policy_distill",
        needs_teacher=True,
        required_inputs=("teacher_logprobs",),
    ),
    AlgorithmPreset(
        name="jsd",
        description="On-policy distillation with a Jensen-Shannon divergence advantage",
        policy_loss="ppo",
        advantage="jsd",
        needs_teacher=True,
        required_inputs=("teacher_logprobs",),
    ),
    AlgorithmPreset(
        name="gigpo",
        description="GiGPO: episode-level plus anchor-state step-level group advantages (multi-step agents)",
        policy_loss="ppo",
        advantage_args={"omega": 1.0, "fnorm": "none", "epsilon": 1e-6},
        policy_loss_args={"clip_range_low": 0.2, "clip_range_high": 0.2, "loss_agg_mode": "token-mean"},
        **{**_GROUP_RL, "advantage": "gigpo", "repeat_times": 8},
    ),
    AlgorithmPreset(
        name="opmd",
        description="OPMD: online policy mirror descent, group-mean baseline, tau-regularized REINFORCE loss",
        policy_loss="opmd",
        **{**_GROUP_RL, "advantage": "opmd"},
    ),
    AlgorithmPreset(
        name="multi_step_grpo",
        description="Multi-step GRPO: GRPO over whole episodes, each episode's score on every one of its steps",
        policy_loss="ppo",
        required_inputs=("episode_ids",),
        **{**_GROUP_RL, "advantage": "step_wise_grpo", "repeat_times": 8},
    ),
    AlgorithmPreset(
        name="mix",
        description="MIX: PPO on rollouts mixed with plain SFT on expert rows at a constant weight mu",
        policy_loss="mix",
        advantage="grpo",
        entropy="mix",
        uses_expert_data=True,
        repeat_times=8,
    ),
    AlgorithmPreset(
        name="raft",
        description="RAFT: fine-tune on the policy's own rewarded rollouts (SFT loss after a reward filter)",
        policy_loss="sft",
        required_buffer_operators=("reward_filter",),
        repeat_times=4,
    ),
    AlgorithmPreset(
        name="m2po",
        description="M2PO: unclipped importance sampling, masking the tokens that push the log-ratio's "
        "second moment over a bound (stale rollouts)",
        policy_loss="m2po",
        advantage="grpo",
        entropy="default",
        repeat_times=8,
    ),
    AlgorithmPreset(
        name="remax",
        description="ReMax: REINFORCE with the reward of a greedy response to the same task as baseline",
        policy_loss="ppo",
        required_inputs=("reward_baselines",),
        **{**_GROUP_RL, "advantage": "remax", "repeat_times": 1},
    ),
    AlgorithmPreset(
        name="is_ppo",
        description="IS-PPO: the importance-sampling surrogate -A * pi / pi_old without PPO's clip",
        policy_loss="importance_sampling",
        **_GROUP_RL,
    ),
):
    register_preset(_preset)
