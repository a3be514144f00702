"""Selectors decide which row is the n-th task handed out; a registry keyed by the config name.

Position-based selectors are pure functions of (position, seed), so every buffer replica agrees
on the order without coordination; only the `difficulty` selector needs state (pass rates).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import lru_cache

from trinity.registry import Registry

PositionSelector = Callable[[int, int, int], int]  # (position, size, seed) -> row index
# The position selectors; `difficulty` is not one of them (the task set runs it on its pass rates).
SELECTORS: Registry[PositionSelector] = Registry("selector")
register_selector = SELECTORS.register


@register_selector("sequential")
def sequential(position: int, size: int, seed: int) -> int:
    return position % size


@register_selector("shuffle")
def shuffle(position: int, size: int, seed: int) -> int:
    """A fresh permutation every epoch; each row exactly once per epoch."""
    epoch, offset = divmod(position, size)
    return _permutation(size, seed, epoch)[offset]


@register_selector("random")
def uniform(position: int, size: int, seed: int) -> int:
    """Sampling with replacement: rows may repeat within an epoch."""
    return random.Random(f"{seed}:{position}").randrange(size)


@lru_cache(maxsize=8)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


def pick_by_difficulty(
    candidates: list[int],
    pass_rates: dict[int, float],
    count: int,
    *,
    target: float,
    temperature: float,
    rng: random.Random,
) -> list[int]:
    """Choose `count` rows whose pass rate is closest to `target` (a curriculum at the edge of ability).

    Rows never scored count as exactly on target, so new tasks are explored first. With temperature 0
    the choice is greedy (ties by row order); otherwise rows are drawn without replacement with weight
    exp(-|pass_rate - target| / temperature).
    """
    distance = {i: abs(pass_rates.get(i, target) - target) for i in candidates}
    if temperature <= 0:
        return sorted(candidates, key=lambda i: (distance[i], i))[:count]
    pool = list(candidates)
    chosen: list[int] = []
    while pool and len(chosen) < count:
        weights = [math.exp(-distance[i] / temperature) for i in pool]
        pick = rng.choices(range(len(pool)), weights=weights)[0]
        chosen.append(pool.pop(pick))
    return chosen
