"""Reward functions: plain `(response_text, task) -> float | dict[str, float]`, registered by name.

A dict reward names its parts; its total is the `"reward"` entry if present, else the sum of the
parts. `evaluate_reward` runs any reward under a timeout and turns exceptions into a failed
outcome, so one bad reward never stops the explorer. Rewards that score a whole group at once (a
judge ranking the responses to one task) are `trinity.explorer.rewards.judge.GroupReward`s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trinity.registry import Registry
from trinity.v1 import common_pb2

T = TypeVar("T")
RewardFn = Callable[[str, common_pb2.Task], "float | dict[str, float]"]

REWARDS: Registry[RewardFn] = Registry("reward")


@dataclass
class RewardOutcome:
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    error: str = ""


def evaluate_reward(fn: RewardFn, response_text: str, task: common_pb2.Task, timeout_s: float = 10.0) -> RewardOutcome:
    """Score one response; a reward that raises or runs past `timeout_s` gives `failed=True`."""
    try:
        value = call_bounded(lambda: fn(response_text, task), timeout_s, "reward")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever a reward raises marks the sample failed
        return RewardOutcome(failed=True, error=str(e) if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}")
    return _to_outcome(value)


def call_bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """`fn()` in a daemon thread, waited for at most `timeout_s`; re-raises what it raised.

    Python cannot kill a thread, so a call stuck in a loop keeps that thread (not the explorer)
    busy; calls that can hang on input (symbolic math, a judge engine) should bound themselves too,
    as the built-in rewards do. Raises `TimeoutError` naming `what` when the time runs out.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller below
            box["error"] = e

    thread = threading.Thread(target=target, name=f"trinity-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} timed out after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _to_outcome(value: object) -> RewardOutcome:
    if isinstance(value, dict):
        parts = {str(k): float(v) for k, v in value.items()}
        total = parts.get("reward", sum(parts.values()))
        return RewardOutcome(reward=float(total), components=parts)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return RewardOutcome(reward=float(value))
    return RewardOutcome(failed=True, error=f"reward returned {type(value).__name__}, expected float or dict")
