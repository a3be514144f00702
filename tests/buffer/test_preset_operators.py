"""A preset's data operators reach the experience stream without the user listing them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.buffer.helpers import experience
from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig
from trinity.config.preset_operators import applied_by_preset, stream_operators
from trinity.registry_names import KINDS


def _config(algorithm: str, operators: tuple[dict[str, Any], ...] = (), max_response_tokens: int = 20) -> RunConfig:
    return RunConfig.model_validate(
        {
            "mode": "explore",
            "model": {"path": "unused", "max_response_tokens": max_response_tokens},
            "algorithm": {"algorithm_type": algorithm},
            "buffer": {"taskset": {"path": "unused.jsonl"}, "experience_stream": {"operators": operators}},
        }
    )


def test_dapo_gets_overlong_shaping_then_the_group_filter_sized_from_the_response_budget():
    ops = stream_operators(_config("dapo", max_response_tokens=20))
    assert [op.name for op in ops] == ["overlong_reward_penalty", "reward_std_filter"]
    assert ops[0].params == {"max_response_length": 20, "cache_length": 4}


def test_a_configured_operator_keeps_its_place_and_parameters():
    mine = {"name": "reward_std_filter", "params": {"min_std": 0.1}}
    config = _config("dapo", operators=({"name": "invalid_reward_filter"}, mine))
    ops = stream_operators(config)
    assert [op.name for op in ops] == ["invalid_reward_filter", "reward_std_filter", "overlong_reward_penalty"]
    assert ops[1].params == {"min_std": 0.1}
    assert [op.name for op in applied_by_preset(config)] == ["overlong_reward_penalty"]


def test_a_preset_without_needs_leaves_the_stream_as_configured():
    config = _config("grpo", operators=({"name": "invalid_reward_filter"},))
    assert [op.name for op in stream_operators(config)] == ["invalid_reward_filter"]
    assert applied_by_preset(config) == ()


@pytest.mark.skipif("raft" not in KINDS["algorithm"].builtins, reason="the raft preset has not landed")
def test_raft_keeps_only_rewarded_samples():
    (op,) = stream_operators(_config("raft"))
    assert op.name == "reward_filter" and op.params == {"above": 0.0}


def test_a_dapo_stream_drops_signal_free_groups_and_penalizes_overlong_answers(buffer_service: Any, unique: str):
    """Through the real Buffer: the operators the gateway would give a DAPO run's stream."""
    ops = stream_operators(_config("dapo", max_response_tokens=10))  # cache 2: free up to 8 tokens
    spec = StreamConfig(name=f"dapo-{unique}", operators=ops)
    same = [experience(group_id="same", reward=1.0, tokens=4) for _ in range(2)]
    mixed = [experience(group_id="mixed", reward=1.0, tokens=9), experience(group_id="mixed", reward=0.0, tokens=4)]
    # equal raw rewards, but one answer overran: shaping comes first, so the group has signal and stays
    shaped = [experience(group_id="shaped", reward=1.0, tokens=10), experience(group_id="shaped", reward=1.0, tokens=4)]
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(spec)
        put = buffer.put(spec.name, [*same, *mixed, *shaped])
        batch = buffer.read(spec.name, "c", 10)
    assert put.accepted == 4 and put.dropped["reward_std_filter"] == 2
    rewards = {(e.group_id, len(e.response_token_ids)): e.reward for e in batch.experiences}
    assert rewards == {("mixed", 9): 0.5, ("mixed", 4): 0.0, ("shaped", 10): 0.0, ("shaped", 4): 1.0}
