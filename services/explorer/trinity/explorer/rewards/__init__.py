"""Reward functions by registry name; `get_reward` also accepts `composite:a=w,b=w` specs."""

from trinity.explorer.rewards.base import REWARDS, RewardFn, RewardOutcome, evaluate_reward
from trinity.explorer.rewards.composite import COMPOSITE_PREFIX, composite_reward, parse_composite


def get_reward(name: str) -> RewardFn:
    """The reward registered as `name`, or a composite built from a `composite:...` spec."""
    if name.startswith(COMPOSITE_PREFIX):
        return parse_composite(name)
    return REWARDS.get(name)


__all__ = [
    "REWARDS",
    "RewardFn",
    "RewardOutcome",
    "composite_reward",
    "evaluate_reward",
    "get_reward",
    "parse_composite",
]
