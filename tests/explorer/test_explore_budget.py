"""Dynamic sampling on the explorer side: explore on until the trainer's batches are filled, with a cap."""

from __future__ import annotations

from collections.abc import Callable

from trinity.config import RunConfig
from trinity.explorer.rollout import ExploreBudget


def _config(mode: str = "both", factor: float = 4.0) -> RunConfig:
    # 2 tasks x 2 samples = 4 experiences a step = one train batch; 3 train steps
    return RunConfig.model_validate(
        {
            "mode": mode,
            "model": {"path": "unused"},
            "algorithm": {"algorithm_type": "dapo", "repeat_times": 2},
            "buffer": {"batch_size": 2, "total_steps": 3, "taskset": {"path": "unused.jsonl"}},
            "explorer": {"max_explore_factor": factor},
        }
    )


def _explore(budget: ExploreBudget, accepted: Callable[[int], int], batch: int = 4) -> tuple[int, int, list[int]]:
    """Drive the budget as the rollout loop does; returns (steps, batches fed, version step of each step)."""
    step, put, versions = 0, 0, []
    while budget.more(step, put // batch):
        versions.append(budget.version_step(step, put // batch))
        put += accepted(step)
        step += 1
    return step, put // batch, versions


def test_without_drops_exploring_is_unchanged_one_step_per_batch():
    steps, fed, versions = _explore(ExploreBudget.of(_config()), lambda step: 4)
    assert (steps, fed, versions) == (3, 3, [0, 1, 2])


def test_dropped_groups_are_replaced_by_sampling_more():
    # every odd step's groups all lose their signal and are dropped
    budget = ExploreBudget.of(_config())
    steps, fed, versions = _explore(budget, lambda step: 0 if step % 2 else 4)
    assert (steps, fed) == (5, 3)
    # a step never waits for weights the trainer cannot yet have trained (it holds `fed` batches)
    assert versions == [0, 1, 1, 2, 2]
    assert not budget.capped(steps, fed)


def test_the_cap_ends_exploring_when_nothing_survives():
    budget = ExploreBudget.of(_config(factor=2.0))
    steps, fed, versions = _explore(budget, lambda step: 0)
    assert (steps, fed) == (6, 0) and set(versions) == {0}
    assert budget.capped(steps, fed)


def test_explore_mode_counts_steps_only():
    budget = ExploreBudget.of(_config(mode="explore"))
    steps, _, versions = _explore(budget, lambda step: 0)
    assert (steps, versions) == (3, [0, 1, 2]) and not budget.capped(steps, 0)
