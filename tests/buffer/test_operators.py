"""The data operators as pure functions, with hand-computed expectations."""

from __future__ import annotations

import math

import pytest

from tests.buffer.helpers import experience
from trinity.buffer.operators import OPERATORS, OperatorContext, apply_operators
from trinity.config import OperatorConfig


def _run(ops, exps, ctx=None):
    return apply_operators(exps, [OperatorConfig(**op) for op in ops], ctx or OperatorContext())


def test_reward_filter_keeps_the_closed_interval():
    exps = [experience(reward=r) for r in (-1.0, 0.0, 0.5, 1.0, 2.0)]
    out = _run([{"name": "reward_filter", "params": {"min_reward": 0.0, "max_reward": 1.0}}], exps)
    assert [e.reward for e in out.kept] == [0.0, 0.5, 1.0]
    assert out.dropped["reward_filter"] == 2


def test_invalid_reward_filter_drops_failed_and_non_finite():
    exps = [experience(reward=1.0), experience(failed=True), experience(reward=math.nan), experience(reward=math.inf)]
    out = _run([{"name": "invalid_reward_filter"}], exps)
    assert len(out.kept) == 1 and out.dropped["invalid_reward_filter"] == 3


def test_reward_std_filter_drops_groups_without_signal():
    exps = [
        *[experience(group_id="same", reward=1.0) for _ in range(3)],
        experience(group_id="single", reward=1.0),
        *[experience(group_id="varied", reward=r) for r in (0.0, 1.0)],
        *[experience(group_id="tiny", reward=r) for r in (0.5, 0.52)],  # std 0.01
    ]
    out = _run([{"name": "reward_std_filter", "params": {"min_std": 0.05}}], exps)
    assert {e.group_id for e in out.kept} == {"varied"}
    assert out.dropped["reward_std_filter"] == 6


def test_reward_shaping_is_a_linear_combination_of_components():
    exps = [experience(reward=1.0, components={"format": 1.0, "length": 120.0})]
    params = {"reward": 1.0, "format": 0.5, "length": -0.01, "bias": 0.1}
    (shaped,) = _run([{"name": "reward_shaping", "params": params}], exps).kept
    # 0.1 + 1.0 * 1.0 + 0.5 * 1.0 - 0.01 * 120 = 0.4
    assert shaped.reward == pytest.approx(0.4)
    assert shaped.reward_components["raw_reward"] == 1.0


def test_operators_run_in_order():
    exps = [experience(group_id="g", reward=r, components={"bonus": b}) for r, b in ((1.0, 0.0), (1.0, 1.0))]
    # Equal rewards: std filter alone would drop the group; shaping first makes them differ.
    out = _run(
        [{"name": "reward_shaping", "params": {"reward": 1.0, "bonus": 1.0}}, {"name": "reward_std_filter"}], exps
    )
    assert [e.reward for e in out.kept] == [1.0, 2.0]


def test_registry_lists_the_builtins():
    assert set(OPERATORS.names()) >= {
        "reward_filter",
        "reward_std_filter",
        "invalid_reward_filter",
        "reward_shaping",
    }
