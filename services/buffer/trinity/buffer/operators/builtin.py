"""The built-in operators (Trinity-RFT's reward filters, DAPO's dynamic sampling, shaping).

Pass rates are not an operator: the explorer reports them when it completes its leases
(`CompleteTasks`), the one writer of the curriculum's input.
"""

from __future__ import annotations

import math
from collections import defaultdict

from trinity.buffer.operators.registry import OperatorContext, register_operator
from trinity.v1 import common_pb2

Experiences = list[common_pb2.Experience]


@register_operator("reward_filter")
def reward_filter(
    experiences: Experiences,
    ctx: OperatorContext,
    min_reward: float = -math.inf,
    max_reward: float = math.inf,
    above: float = -math.inf,
) -> Experiences:
    """Keep experiences whose reward lies in [min_reward, max_reward] and is strictly greater than `above`
    (RAFT keeps the rewarded samples: `above: 0`)."""
    return [e for e in experiences if min_reward <= e.reward <= max_reward and e.reward > above]


@register_operator("invalid_reward_filter")
def invalid_reward_filter(experiences: Experiences, ctx: OperatorContext) -> Experiences:
    """Drop experiences whose workflow or reward failed, or whose reward is NaN or infinite."""
    return [e for e in experiences if not e.failed and math.isfinite(e.reward)]


@register_operator("reward_std_filter")
def reward_std_filter(experiences: Experiences, ctx: OperatorContext, min_std: float = 0.0) -> Experiences:
    """Drop whole groups whose reward standard deviation is <= min_std (DAPO's dynamic sampling).

    A group whose rewards are all equal has zero group-relative advantage: it costs a train step and
    teaches nothing. Groups are judged on what arrives in one Put (the Explorer puts a group at once).
    """
    groups: dict[str, list[float]] = defaultdict(list)
    for e in experiences:
        groups[e.group_id].append(e.reward)
    keep = {gid for gid, rewards in groups.items() if _population_std(rewards) > min_std}
    return [e for e in experiences if e.group_id in keep]


@register_operator("overlong_reward_penalty")
def overlong_reward_penalty(
    experiences: Experiences,
    ctx: OperatorContext,
    max_response_length: float,
    cache_length: float,
    penalty_factor: float = 1.0,
) -> Experiences:
    """DAPO's soft overlong punishment added to each reward (kept as `reward_components["overlong_penalty"]`).

    0 up to `max_response_length - cache_length` response tokens, then linear down to -1 at
    `max_response_length`, -1 beyond; all times `penalty_factor`. The formula of
    `trinity.algorithms.overlong_reward_penalty`, restated here because the buffer pulls no torch (a test
    holds the two equal). Failed experiences keep their reward: the failure is what they report.
    """
    if not 0 < cache_length <= max_response_length:
        raise ValueError(
            f"overlong_reward_penalty: need 0 < cache_length <= max_response_length, "
            f"got cache_length={cache_length} and max_response_length={max_response_length}"
        )
    expected = max_response_length - cache_length
    for e in experiences:
        if e.failed:
            continue
        penalty = penalty_factor * min(0.0, max(-1.0, (expected - len(e.response_token_ids)) / cache_length))
        e.reward_components["overlong_penalty"] = penalty
        e.reward += penalty
    return experiences


@register_operator("reward_shaping")
def reward_shaping(experiences: Experiences, ctx: OperatorContext, **weights: float) -> Experiences:
    """reward := bias + sum(w_k * component_k); the component `reward` is the reward as it arrived.

    Example params: {"reward": 1.0, "format": 0.1, "length_penalty": -0.01, "bias": 0.0}. The original
    reward is kept in `reward_components["raw_reward"]`. A component the experience lacks counts as 0.
    """
    bias = float(weights.pop("bias", 0.0))
    for e in experiences:
        raw = e.reward
        values = dict(e.reward_components)
        values["reward"] = raw
        e.reward_components["raw_reward"] = raw
        e.reward = bias + sum(w * values.get(name, 0.0) for name, w in weights.items())
    return experiences


def _population_std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
