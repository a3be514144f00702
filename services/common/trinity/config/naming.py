"""Buffer names a run uses; every service derives them the same way from (run id, stage)."""

from __future__ import annotations

from collections.abc import Sequence


def experience_stream(run_id: str, stage: int, name: str = "experiences") -> str:
    return f"{run_id}.s{stage}.{name}"


def taskset(run_id: str, stage: int, name: str) -> str:
    return f"{run_id}.s{stage}.{name}"


def mixture(run_id: str, stage: int) -> str:
    """The mixture of the stage's train task sets: `_` sets it apart from every task set's name (a name starts with
    a letter or a digit)."""
    return f"{run_id}.s{stage}._train"


def train_tasks(run_id: str, stage: int, tasksets: Sequence[str]) -> str:
    """What train tasks are leased from: the one train task set itself (a mixture of one), or the mixture."""
    return taskset(run_id, stage, tasksets[0]) if len(tasksets) == 1 else mixture(run_id, stage)
