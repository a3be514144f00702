"""``trinity.algorithms``: RL algorithms as registered pure tensor functions (torch only).

Build a component by name, with optional hyperparameter overrides, then call it with keyword tensors::

    from trinity import algorithms as A

    adv_fn = A.advantage("grpo")
    advantages, _ = adv_fn(rewards=rewards, mask=mask, group_ids=group_ids)
    loss_fn = A.policy_loss("ppo", clip_range_high=0.28)
    loss, metrics = loss_fn(logprobs=lp, old_logprobs=old_lp, advantages=advantages, mask=mask)

See docs/algorithms.md for the call convention, the presets and how to add an algorithm.
"""

from __future__ import annotations

from typing import Any

from trinity.algorithm_table import Preset
from trinity.config.algorithm import PRESETS

from .advantages import broadcast_to_tokens, discounted_cumsum, group_stats, outcome_token_rewards
from .aggregation import (
    LOSS_AGG_MODES,
    LOSS_AGGREGATIONS,
    PAIR_MEAN,
    Aggregation,
    agg_loss,
    loss_share,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .entropy import entropy_from_logits
from .kl import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_controller, kl_loss
from .policy_losses import chord_mu_schedule
from .registry import (
    ADVANTAGES,
    ENTROPY_TERMS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    VALUE_LOSSES,
    BoundFn,
    DuplicateNameError,
    UnknownNameError,
    UnknownOverrideError,
    register_advantage,
    register_entropy,
    register_kl,
    register_policy_loss,
    register_value_loss,
)
from .reward_shaping import overlong_reward_penalty
from .value_losses import clipped_value_loss


def advantage(name: str, **overrides: Any) -> BoundFn:
    """The advantage estimator ``name`` with hyperparameter ``overrides``."""
    return ADVANTAGES.build(name, **overrides)


def policy_loss(name: str, **overrides: Any) -> BoundFn:
    """The policy loss ``name`` with hyperparameter ``overrides``."""
    return POLICY_LOSSES.build(name, **overrides)


def kl(name: str, **overrides: Any) -> BoundFn:
    """The per-token KL estimator ``name``: ``(logprobs, ref_logprobs) -> [batch, seq]``."""
    return KL_ESTIMATORS.build(name, **overrides)


def entropy(name: str, **overrides: Any) -> BoundFn:
    """The entropy term ``name``: ``(mask, entropies=... | logits=...) -> (loss, metrics)``."""
    return ENTROPY_TERMS.build(name, **overrides)


def value_loss(name: str = "clipped", **overrides: Any) -> BoundFn:
    """The critic loss ``name``: ``(values, old_values, returns, mask) -> (loss, metrics)``."""
    return VALUE_LOSSES.build(name, **overrides)


def preset(name: str) -> Preset:
    """The algorithm preset registered as ``name`` (an ``algorithm_type``; see ``trinity.algorithm_table``)."""
    return PRESETS.get(name)


def register_preset(p: Preset) -> Preset:
    """Register ``p`` under its name (an ``algorithm_type``); a name already taken is an error."""
    return PRESETS.register(p.name)(p)


def available() -> dict[str, list[str]]:
    """Registered names per registry kind."""
    return {
        "advantages": ADVANTAGES.names(),
        "policy_losses": POLICY_LOSSES.names(),
        "kl": KL_ESTIMATORS.names(),
        "entropy": ENTROPY_TERMS.names(),
        "value_losses": VALUE_LOSSES.names(),
        "presets": PRESETS.names(),
    }


__all__ = [
    "ADVANTAGES",
    "ENTROPY_TERMS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LOSS_AGG_MODES",
    "PAIR_MEAN",
    "POLICY_LOSSES",
    "PRESETS",
    "VALUE_LOSSES",
    "AdaptiveKLController",
    "Aggregation",
    "BoundFn",
    "DuplicateNameError",
    "FixedKLController",
    "Preset",
    "UnknownNameError",
    "UnknownOverrideError",
    "advantage",
    "agg_loss",
    "apply_kl_penalty",
    "available",
    "broadcast_to_tokens",
    "chord_mu_schedule",
    "clipped_value_loss",
    "discounted_cumsum",
    "entropy",
    "entropy_from_logits",
    "group_stats",
    "kl",
    "kl_controller",
    "kl_loss",
    "loss_share",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "outcome_token_rewards",
    "overlong_reward_penalty",
    "policy_loss",
    "preset",
    "register_advantage",
    "register_entropy",
    "register_kl",
    "register_policy_loss",
    "register_preset",
    "register_value_loss",
    "value_loss",
]
