"""A run's mode (`mode: both` in YAML): which services take part and what its explorers do."""

from __future__ import annotations

from enum import StrEnum


class RunMode(StrEnum):
    BOTH = "both"  # explore and train
    EXPLORE = "explore"  # explore only: rollouts into the stream, no trainer
    TRAIN = "train"  # train on offline data, no explorer
    BENCH = "bench"  # evaluate the model on the eval task sets
    SERVE = "serve"  # an OpenAI API whose rewarded sessions are trained on

    def __repr__(self) -> str:
        """`'both'`, as YAML writes it: a message that quotes a mode (`mode {mode!r}`) reads as it did as text."""
        return repr(self.value)


EXPLORER_MODES = frozenset({RunMode.BOTH, RunMode.EXPLORE, RunMode.BENCH, RunMode.SERVE})  # runs with explorers
TRAINER_MODES = frozenset({RunMode.BOTH, RunMode.TRAIN, RunMode.SERVE})  # serve trains on the sessions it records
EXPLORING_MODES = frozenset({RunMode.BOTH, RunMode.EXPLORE})  # explorers walk a task set (the loop steering acts on)
ONLINE_MODES = frozenset({RunMode.BOTH, RunMode.SERVE})  # a trainer fed by explorers, whose weights it updates
