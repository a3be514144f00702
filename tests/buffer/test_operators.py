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


def test_reward_filter_above_keeps_only_rewarded_samples():
    exps = [experience(reward=r) for r in (-0.5, 0.0, 0.25, 1.0)]
    out = _run([{"name": "reward_filter", "params": {"above": 0.0}}], exps)
    assert [e.reward for e in out.kept] == [0.25, 1.0]


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


def _overlong(max_len: float, cache: float, **extra: float) -> dict:
    return {
        "name": "overlong_reward_penalty",
        "params": {"max_response_length": max_len, "cache_length": cache, **extra},
    }


def test_overlong_reward_penalty_adds_dapos_soft_punishment_by_hand():
    # L_max 10, cache 4: free up to 6 tokens, then -1/4 per token, -1 from 10 tokens on
    exps = [experience(reward=1.0, tokens=n) for n in (5, 6, 7, 9, 10, 12)]
    kept = _run([_overlong(10, 4)], exps).kept
    assert [e.reward for e in kept] == [1.0, 1.0, 0.75, 0.25, 0.0, 0.0]
    assert [e.reward_components["overlong_penalty"] for e in kept] == [0.0, 0.0, -0.25, -0.75, -1.0, -1.0]
    doubled = _run([_overlong(10, 4, penalty_factor=2.0)], [experience(reward=1.0, tokens=7)]).kept
    assert doubled[0].reward == 0.5


def test_overlong_reward_penalty_equals_the_algorithm_librarys_formula():
    torch = pytest.importorskip("torch")
    from trinity.algorithms import overlong_reward_penalty

    lengths = list(range(0, 40, 3))
    exps = [experience(reward=0.0, tokens=n) for n in lengths]
    kept = _run([_overlong(30, 7, penalty_factor=1.5)], exps).kept
    expected = overlong_reward_penalty(
        torch.tensor(lengths), max_response_length=30, cache_length=7, penalty_factor=1.5
    )
    assert [e.reward for e in kept] == pytest.approx(expected.tolist())


def test_overlong_reward_penalty_leaves_failed_experiences_alone():
    (failed,) = _run([_overlong(4, 2)], [experience(failed=True, tokens=8)]).kept
    assert failed.reward == 0.0 and "overlong_penalty" not in failed.reward_components


def test_overlong_reward_penalty_names_a_bad_window():
    with pytest.raises(ValueError, match=r"cache_length=12.0 and max_response_length=10.0"):
        _run([_overlong(10, 12)], [experience()])
