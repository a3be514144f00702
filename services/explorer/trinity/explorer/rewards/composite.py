"""Weighted sums of registered rewards, e.g. `composite:math=0.9,format=0.1`."""

from __future__ import annotations

from collections.abc import Mapping

from trinity.config.registered import COMPOSITE_PREFIX, parse_composite_reward
from trinity.explorer.rewards.base import REWARDS, RewardFn, _to_outcome
from trinity.v1 import common_pb2

__all__ = ["COMPOSITE_PREFIX", "composite_reward", "parse_composite"]


def composite_reward(weights: Mapping[str, float]) -> RewardFn:
    """A reward returning `{name: part, ..., "reward": sum(weight * part)}` over registered rewards."""
    parts = {name: REWARDS.get(name) for name in weights}

    def reward(response_text: str, task: common_pb2.Task) -> dict[str, float]:
        out: dict[str, float] = {}
        total = 0.0
        for name, fn in parts.items():
            value = _to_outcome(fn(response_text, task))
            if value.failed:
                raise ValueError(f"part {name!r}: {value.error}")
            out[name] = value.reward
            total += weights[name] * value.reward
        out["reward"] = total
        return out

    return reward


def parse_composite(spec: str) -> RewardFn:
    """Build a composite from `composite:name=weight,name=weight` (the grammar the config validates)."""
    return composite_reward(parse_composite_reward(spec))


# The R1-style default for math with a format bonus.
REWARDS.register("math_format")(composite_reward({"math": 0.9, "format": 0.1}))
# math-verify's check of the final answer, with a bonus for stating one (`\boxed{}` or `#### x`).
REWARDS.register("math_verify_format")(composite_reward({"math_verify": 0.9, "final_answer": 0.1}))
