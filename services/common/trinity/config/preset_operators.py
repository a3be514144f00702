"""The data operators an algorithm preset implies (`Preset.operators`), applied to the experience stream without
the user listing them. The parameters come from the run config (DAPO's overlong window from the response budget).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from trinity.config.buffer import OperatorConfig
from trinity.config.run import RunConfig

# DAPO's overlong cache: the last 4096 of its 20480 response tokens, the same fifth of any budget.
OVERLONG_CACHE_FRACTION = 0.2
# RAFT trains on the rewarded samples, those with a reward above 0 (as Trinity-RFT's RAFT keeps).
RAFT_REWARD_ABOVE = 0.0


def _overlong(config: RunConfig) -> dict[str, float]:
    budget = config.model.max_response_tokens
    return {"max_response_length": budget, "cache_length": max(1, round(budget * OVERLONG_CACHE_FRACTION))}


_PARAMS: Mapping[str, Callable[[RunConfig], dict[str, float]]] = MappingProxyType(
    {
        "overlong_reward_penalty": _overlong,
        "reward_std_filter": lambda config: {},
        "reward_filter": lambda config: {"above": RAFT_REWARD_ABOVE},
    }
)


def preset_operators(config: RunConfig) -> tuple[OperatorConfig, ...]:
    """The operators `config.algorithm.algorithm_type` needs, with their parameters for this run."""
    names = config.algorithm.preset.operators
    return tuple(OperatorConfig(name=name, params=_PARAMS[name](config) if name in _PARAMS else {}) for name in names)


def stream_operators(config: RunConfig) -> tuple[OperatorConfig, ...]:
    """The stream's operators: the configured ones, then those the preset needs that the config does not name.

    A configured operator of the same name wins (its parameters and place), so a user can tune or move one.
    """
    return (*config.buffer.experience_stream.operators, *applied_by_preset(config))


def applied_by_preset(config: RunConfig) -> tuple[OperatorConfig, ...]:
    """The operators the preset added to the stream (those the config does not name), for the run summary."""
    named = {op.name for op in config.buffer.experience_stream.operators}
    return tuple(op for op in preset_operators(config) if op.name not in named)
