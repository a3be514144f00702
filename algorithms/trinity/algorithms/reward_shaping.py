"""Reward shaping helpers used by presets (applied to rewards before the advantage estimator)."""

from __future__ import annotations

import torch


def overlong_reward_penalty(
    response_lengths: torch.Tensor,
    *,
    max_response_length: int,
    cache_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment, to be *added* to the rewards: ``[batch] -> [batch]``.

    With ``L_max = max_response_length`` and ``L_cache = cache_length``:
    0 for ``L <= L_max - L_cache``; ``(L_max - L_cache - L) / L_cache`` (linear from 0 to -1) inside the cache
    window; -1 beyond ``L_max``; all times ``penalty_factor``.
    """
    if not 0 < cache_length <= max_response_length:
        raise ValueError(f"need 0 < cache_length <= max_response_length, got {cache_length} and {max_response_length}")
    lengths = response_lengths.float()
    expected = max_response_length - cache_length
    penalty = torch.clamp((expected - lengths) / cache_length, min=-1.0, max=0.0)
    return penalty * penalty_factor
