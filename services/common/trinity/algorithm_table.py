"""Every fact about the algorithm library in one torch-free table: its functions and its presets.

The gateway, the CLI, the buffer, the explorer and the trainer all read this module (plain data, no imports beyond
the standard library), so a fact about an algorithm is stated once:

- `FUNCTIONS`: each built-in advantage, policy loss, KL estimator, entropy term and value loss by kind and name, the
  module that registers it and its hyperparameters with their defaults. The config validates overrides against
  these without importing torch; `trinity.algorithms` takes each function's defaults from here when it registers,
  and refuses a function whose signature does not name them (tests/algorithms/test_table.py).
- `PRESETS`: each `algorithm_type`: its functions and their arguments, its KL terms, the per-row inputs its batches
  must carry (`RowInput`), the data operators it implies, its data kind and its default group size.
- `WORKFLOW_INPUTS`: the per-row inputs each built-in workflow writes, so that a run whose workflow cannot feed its
  preset is refused when the config is parsed.

A plugin adds a preset through the entry-point group `trinity.algorithms` with a `Preset` of this module, and a
function with the registry decorators of `trinity.algorithms` (its hyperparameters declared there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal

DataKind = Literal["rollout", "sft", "preference"]
FunctionKind = Literal["advantage", "policy_loss", "kl_estimator", "entropy_term", "value_loss"]


class RowInput(StrEnum):
    """Per-row inputs only some batches carry; the value is the keyword a library function receives."""

    EPISODE_IDS = "episode_ids"  # Experience.episode_id: the rows of one multi-step episode
    STATE_KEYS = "step_group_ids"  # Experience.state_key: steps taken from the same state of a task's episodes
    STEP_REWARDS = "step_rewards"  # Experience.reward_components["return_to_go"]
    REWARD_BASELINES = "reward_baselines"  # the explorer's greedy sample's reward (ReMax)
    TEACHER_LOGPROBS = "teacher_logprobs"  # the teacher's log-probs: the experiences' or the trainer's teacher model
    EXPERT_MASK = "expert_mask"  # rows that are demonstrations (offline data mixed into RL batches)


# Where each row input comes from, for messages that say how to supply one.
ROW_INPUT_SOURCES: Mapping[RowInput, str] = MappingProxyType(
    {
        RowInput.EPISODE_IDS: "Experience.episode_id, written by multi-step workflows",
        RowInput.STATE_KEYS: "Experience.state_key, written by multi-step workflows",
        RowInput.STEP_REWARDS: "Experience.reward_components['return_to_go'], written by multi-step workflows",
        RowInput.REWARD_BASELINES: "Experience.reward_components['reward_baseline'], the explorer's greedy sample",
        RowInput.TEACHER_LOGPROBS: "Experience.teacher_logprobs or the teacher model (algorithm.teacher_model)",
        RowInput.EXPERT_MASK: "demonstrations of buffer.offline_data mixed into each batch (mode both)",
    }
)

_MULTI_STEP = frozenset({RowInput.EPISODE_IDS, RowInput.STATE_KEYS, RowInput.STEP_REWARDS})
# The row inputs each built-in workflow writes (single-turn ones add a greedy sample's reward when the preset asks).
# A plugin workflow is not listed: the trainer refuses a batch that lacks an input its preset needs.
WORKFLOW_INPUTS: Mapping[str, frozenset[RowInput]] = MappingProxyType(
    {
        "math": frozenset({RowInput.REWARD_BASELINES}),
        "countdown": frozenset({RowInput.REWARD_BASELINES}),
        "multi_turn": frozenset(),
        "react": frozenset(),
        "multi_step": _MULTI_STEP,
        "frozen_lake": _MULTI_STEP,
        "textworld": _MULTI_STEP,
        "scienceworld": _MULTI_STEP,
    }
)


@dataclass(frozen=True)
class FunctionSpec:
    """One built-in library function: its kind, name, registering module and hyperparameter defaults."""

    kind: FunctionKind
    name: str
    module: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))


_ALG = "trinity.algorithms"
_AGG = {"loss_agg_mode": "token-mean", "norm_constant": None}
_CLIP = {"clip_range": 0.2, "clip_range_low": None, "clip_range_high": None, "clip_ratio_c": 3.0}


def _specs(kind: FunctionKind, module: str, table: Mapping[str, Mapping[str, Any]]) -> list[FunctionSpec]:
    return [FunctionSpec(kind, name, f"{_ALG}.{module}", params) for name, params in table.items()]


_GAE = {"gamma": 1.0, "lam": 1.0, "whiten": True}
FUNCTIONS: Mapping[tuple[FunctionKind, str], FunctionSpec] = MappingProxyType(
    {
        (spec.kind, spec.name): spec
        for spec in (
            *_specs(
                "advantage",
                "advantages",
                {
                    "grpo": {"epsilon": 1e-6, "std_normalize": True},
                    "rec": {"epsilon": 1e-6, "std_normalize": False},
                    "rloo": {},
                    "reinforce": {},
                    "asymre": {"baseline_shift": -0.1},
                    "opmd": {"opmd_baseline": "mean", "tau": 1.0},
                    "remax": {},
                    "reinforceplusplus": {"gamma": 1.0},
                    "gae": _GAE,
                    "ppo": _GAE,
                    "on_policy_distill": {"kl_coef": 1.0, "reward_to_go": False, "gamma": 1.0},
                    "jsd": {"lambda_coef": 0.5, "kl_coef": 1.0},
                    "step_wise_grpo": {"epsilon": 1e-6, "enable_step_norm": False, "std_cal_level": "group"},
                    "gigpo": {"omega": 1.0, "fnorm": "none", "epsilon": 1e-6},
                },
            ),
            *_specs(
                "policy_loss",
                "policy_losses.clipped",
                {
                    "ppo": {**_CLIP, **_AGG},
                    "gspo": {
                        "clip_range": None,
                        "clip_range_low": 3e-4,
                        "clip_range_high": 4e-4,
                        "loss_agg_mode": "seq-mean-token-mean",
                        "norm_constant": None,
                    },
                    "cispo": {"clip_range_low": 1.0, "clip_range_high": 0.28, **_AGG},
                    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05, **_AGG},
                    "sppo": {"epsilon": 0.3, **_AGG},
                },
            ),
            *_specs(
                "policy_loss",
                "policy_losses.reinforce",
                {
                    "topr": {"advantage_threshold": 0.0, **_AGG},
                    "opmd": {"tau": 1.0, **_AGG},
                    "rec": {
                        "epsilon_low": 0.2,
                        "epsilon_high": 0.2,
                        "epsilon_low_prime": 0.6,
                        "epsilon_high_prime": 2.0,
                        "clip_mode": "none",
                        "weight": "none",
                        "regularizer": "none",
                        "regularizer_coef": 0.0,
                        "temp": 1.0,
                        **_AGG,
                    },
                },
            ),
            *_specs(
                "policy_loss",
                "policy_losses.offline",
                {"sft": _AGG, "sft_phi": _AGG, "dpo": {"beta": 0.1, "label_smoothing": 0.0}},
            ),
            *_specs(
                "policy_loss",
                "policy_losses.chord",
                {
                    "mix": {"mu": 0.1, **_CLIP, **_AGG, "sft_loss_agg_mode": "seq-mean-token-mean"},
                    "mix_chord": {
                        "mu_warmup_steps": 0,
                        "mu_decay_steps": 0,
                        "mu_peak": 0.1,
                        "mu_valley": 0.1,
                        "enable_phi_function": True,
                        **_CLIP,
                        **_AGG,
                    },
                },
            ),
            *_specs(
                "policy_loss",
                "policy_losses.unclipped",
                {"importance_sampling": _AGG, "m2po": {"m2_threshold": 0.04, **_AGG}},
            ),
            *_specs(
                "kl_estimator",
                "kl",
                {"k1": {}, "k2": {}, "k3": {}, "low_var_kl": {"clamp": 10.0}, "abs": {}, "none": {}},
            ),
            *_specs(
                "entropy_term",
                "entropy",
                {"none": {}, "default": {"entropy_coef": 0.0, **_AGG}, "mix": {"entropy_coef": 0.0, **_AGG}},
            ),
            *_specs(
                "value_loss",
                "value_losses",
                {"clipped": {"cliprange_value": 0.5, **_AGG}, "mse": _AGG},
            ),
        )
    }
)


def function_names(kind: str) -> dict[str, str]:
    """Built-in function names of `kind` -> the module that registers each."""
    return {name: spec.module for (k, name), spec in FUNCTIONS.items() if k == kind}


@dataclass(frozen=True)
class Preset:
    """An `algorithm_type`: registered functions composed, with what the rest of the system must provide.

    Attributes:
        policy_loss / advantage / entropy / value_loss: function names (`advantage` None: no advantage, e.g. SFT,
            DPO, RAFT; `value_loss` set exactly for presets that train a critic).
        *_args: arguments over the functions' defaults.
        kl_loss / kl_loss_coef: the KL estimator of the loss term and its weight (`"none"`: no term).
        kl_penalty / kl_penalty_coef: the KL estimator subtracted from token rewards (`"none"`: no penalty).
        needs_teacher: the trainer runs a teacher model (distillation).
        requires: per-row inputs every batch must carry (`RowInput`).
        operators: the experience stream's data operators the preset implies, in application order.
        data_kind: `rollout` (explored), `sft` (demonstrations) or `preference` (DPO pairs).
        repeat_times: the default samples per task (the group of group-relative advantages).
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
    needs_teacher: bool = False
    requires: frozenset[RowInput] = frozenset()
    operators: tuple[str, ...] = ()
    data_kind: DataKind = "rollout"
    repeat_times: int = 1

    def __post_init__(self) -> None:
        for name in ("advantage_args", "policy_loss_args", "entropy_args", "value_loss_args"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        object.__setattr__(self, "requires", frozenset(RowInput(r) for r in self.requires))

    @property
    def online(self) -> bool:
        """Trains on the policy's own rollouts (needs an explorer) rather than on fixed data."""
        return self.data_kind == "rollout"

    @property
    def needs_critic(self) -> bool:
        return self.value_loss is not None

    @property
    def needs_reference(self) -> bool:
        """Some term reads reference log-probs: a KL loss or penalty, or DPO's implicit reward."""
        return self.kl_loss != "none" or self.kl_penalty != "none" or self.data_kind == "preference"

    @property
    def greedy_baseline(self) -> bool:
        """The explorer adds one greedy sample per task whose reward is every sample's baseline (ReMax)."""
        return RowInput.REWARD_BASELINES in self.requires

    @property
    def uses_expert_data(self) -> bool:
        """Demonstrations are mixed into its RL batches (`expert_mask`)."""
        return RowInput.EXPERT_MASK in self.requires

    def functions(self) -> dict[FunctionKind, tuple[str, Mapping[str, Any]]]:
        """Each function the preset trains with: kind -> (name, the preset's arguments)."""
        chosen: dict[FunctionKind, tuple[str, Mapping[str, Any]]] = {
            "policy_loss": (self.policy_loss, self.policy_loss_args)
        }
        if self.advantage is not None:
            chosen["advantage"] = (self.advantage, self.advantage_args)
        if self.entropy != "none":
            chosen["entropy_term"] = (self.entropy, self.entropy_args)
        if self.value_loss is not None:
            chosen["value_loss"] = (self.value_loss, self.value_loss_args)
        return chosen


# Group-relative RL with a reference-KL loss: the shape most presets share (Trinity-RFT's defaults).
_GROUP_RL: dict[str, Any] = dict(advantage="grpo", entropy="default", kl_loss="k2", repeat_times=2)
_MULTI_STEP_RL: dict[str, Any] = {**_GROUP_RL, "repeat_times": 8}
_TOKEN_MEAN_CLIP = {"clip_range_low": 0.2, "clip_range_high": 0.2, "loss_agg_mode": "token-mean"}

PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        p.name: p
        for p in (
            Preset(
                name="ppo",
                description="PPO: GAE advantages from a critic, dual-clip surrogate, clipped value loss",
                policy_loss="ppo",
                advantage="ppo",
                entropy="default",
                value_loss="clipped",
                kl_loss="k2",
            ),
            Preset(
                name="grpo", description="GRPO: group-normalized outcome advantages", policy_loss="ppo", **_GROUP_RL
            ),
            Preset(
                name="dapo",
                description="DAPO: clip-higher, token-mean loss, dynamic sampling, overlong reward shaping, no KL",
                policy_loss="ppo",
                advantage="grpo",
                entropy="default",
                policy_loss_args={"clip_range_low": 0.2, "clip_range_high": 0.28, "loss_agg_mode": "token-mean"},
                # shaping first, so that the group filter judges the shaped reward (as DAPO's does)
                operators=("overlong_reward_penalty", "reward_std_filter"),
                repeat_times=16,
            ),
            Preset(name="gspo", description="GSPO: sequence-level clipped ratio", policy_loss="gspo", **_GROUP_RL),
            Preset(
                name="rloo",
                description="RLOO: leave-one-out baseline",
                policy_loss="ppo",
                **{**_GROUP_RL, "advantage": "rloo"},
            ),
            Preset(
                name="reinforceplusplus",
                description="REINFORCE++: batch-whitened discounted returns",
                policy_loss="ppo",
                **{**_GROUP_RL, "advantage": "reinforceplusplus"},
            ),
            Preset(
                name="sft", description="Supervised fine-tuning on demonstrations", policy_loss="sft", data_kind="sft"
            ),
            Preset(
                name="dpo",
                description="DPO on (chosen, rejected) pairs with a reference model",
                policy_loss="dpo",
                entropy="default",
                kl_loss="k2",
                data_kind="preference",
                repeat_times=2,
            ),
            Preset(
                name="mix_chord",
                description="CHORD: PPO on rollouts mixed with phi-weighted SFT on expert rows, mu scheduled",
                policy_loss="mix_chord",
                advantage="grpo",
                entropy="mix",
                requires=frozenset({RowInput.EXPERT_MASK}),
                repeat_times=8,
            ),
            Preset(
                name="rec",
                description="REC: group-relative REINFORCE with optional clipping/weighting",
                policy_loss="rec",
                **{**_GROUP_RL, "advantage": "rec"},
            ),
            Preset(
                name="topr",
                description="TOPR: tapered off-policy REINFORCE",
                policy_loss="topr",
                **{**_GROUP_RL, "advantage": "reinforce"},
            ),
            Preset(
                name="sppo",
                description="sPPO: log-ratio surrogate inside a trust region, OPMD baseline",
                policy_loss="sppo",
                advantage="opmd",
                repeat_times=2,
            ),
            Preset(
                name="asymre",
                description="AsymRE: shifted group baseline, REINFORCE loss",
                policy_loss="opmd",
                advantage="asymre",
                repeat_times=2,
            ),
            Preset(name="cispo", description="CISPO: clipped importance weights", policy_loss="cispo", **_GROUP_RL),
            Preset(name="sapo", description="SAPO: soft-gated ratio", policy_loss="sapo", **_GROUP_RL),
            Preset(
                name="on_policy_distill",
                description="On-policy distillation: per-token teacher - student log-prob advantages",
                policy_loss="ppo",
                advantage="on_policy_distill",
                needs_teacher=True,
            ),
            Preset(
                name="jsd",
                description="On-policy distillation with a Jensen-Shannon divergence advantage",
                policy_loss="ppo",
                advantage="jsd",
                needs_teacher=True,
            ),
            Preset(
                name="gigpo",
                description="GiGPO: episode-level plus anchor-state step-level group advantages (multi-step agents)",
                policy_loss="ppo",
                advantage_args={"omega": 1.0, "fnorm": "none", "epsilon": 1e-6},
                policy_loss_args=_TOKEN_MEAN_CLIP,
                requires=frozenset({RowInput.EPISODE_IDS, RowInput.STATE_KEYS, RowInput.STEP_REWARDS}),
                **{**_MULTI_STEP_RL, "advantage": "gigpo"},
            ),
            Preset(
                name="opmd",
                description="OPMD: online policy mirror descent, group-mean baseline, tau-regularized REINFORCE loss",
                policy_loss="opmd",
                **{**_GROUP_RL, "advantage": "opmd"},
            ),
            Preset(
                name="multi_step_grpo",
                description="Multi-step GRPO: GRPO over whole episodes, each episode's score on every one of its steps",
                policy_loss="ppo",
                requires=frozenset({RowInput.EPISODE_IDS}),
                **{**_MULTI_STEP_RL, "advantage": "step_wise_grpo"},
            ),
            Preset(
                name="mix",
                description="MIX: PPO on rollouts mixed with plain SFT on expert rows at a constant weight mu",
                policy_loss="mix",
                advantage="grpo",
                entropy="mix",
                requires=frozenset({RowInput.EXPERT_MASK}),
                repeat_times=8,
            ),
            Preset(
                name="raft",
                description="RAFT: fine-tune on the policy's own rewarded rollouts (SFT loss after a reward filter)",
                policy_loss="sft",
                operators=("reward_filter",),
                repeat_times=4,
            ),
            Preset(
                name="m2po",
                description="M2PO: unclipped importance sampling, masking the tokens that push the log-ratio's "
                "second moment over a bound (stale rollouts)",
                policy_loss="m2po",
                advantage="grpo",
                entropy="default",
                repeat_times=8,
            ),
            Preset(
                name="remax",
                description="ReMax: REINFORCE with the reward of a greedy response to the same task as baseline",
                policy_loss="ppo",
                requires=frozenset({RowInput.REWARD_BASELINES}),
                **{**_GROUP_RL, "advantage": "remax", "repeat_times": 1},
            ),
            Preset(
                name="is_ppo",
                description="IS-PPO: the importance-sampling surrogate -A * pi / pi_old without PPO's clip",
                policy_loss="importance_sampling",
                **_GROUP_RL,
            ),
        )
    }
)
