"""Reward functions: plain `(response_text, task) -> float | dict[str, float]`, registered by name.

A dict reward names its parts; its total is the `"reward"` entry if present, else the sum of the
parts. `evaluate_reward` runs any reward under a timeout and turns exceptions into a failed
outcome, so one bad reward never stops the explorer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from trinity.registry import Registry
from trinity.v1 import common_pb2

RewardFn = Callable[[str, common_pb2.Task], "float | dict[str, float]"]

REWARDS: Registry[RewardFn] = Registry("reward")


@dataclass
class RewardOutcome:
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    error: str = ""


def evaluate_reward(fn: RewardFn, response_text: str, task: common_pb2.Task, timeout_s: float = 10.0) -> RewardOutcome:
    """Score one response; a reward that raises or runs past `timeout_s` gives `failed=True`.

    The reward runs in a daemon thread: Python cannot kill a thread, so a reward stuck in a loop
    keeps that thread (not the explorer) busy; rewards that can hang on input (symbolic math)
    should bound themselves too, as the built-in ones do.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn(response_text, task)
        except BaseException as e:  # noqa: BLE001 - whatever a reward raises marks the sample failed
            box["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=target, name="trinity-reward", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return RewardOutcome(failed=True, error=f"reward timed out after {timeout_s:g} s")
    if "error" in box:
        return RewardOutcome(failed=True, error=str(box["error"]))
    return _to_outcome(box.get("value"))


def _to_outcome(value: object) -> RewardOutcome:
    if isinstance(value, dict):
        parts = {str(k): float(v) for k, v in value.items()}
        total = parts.get("reward", sum(parts.values()))
        return RewardOutcome(reward=float(total), components=parts)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return RewardOutcome(reward=float(value))
    return RewardOutcome(failed=True, error=f"reward returned {type(value).__name__}, expected float or dict")
