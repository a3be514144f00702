"""How `trinity run` gives threads to the explorers it starts on one machine."""

from __future__ import annotations

from trinity.cli.commands import explorer_threads
from trinity.config import RunConfig


def _config(**sections: dict) -> RunConfig:
    taskset = {"path": "train.jsonl", "prompt_key": "question", "answer_key": "answer"}
    return RunConfig.model_validate({"name": "t", "model": {"path": "m"}, "buffer": {"taskset": taskset}, **sections})


def test_the_cores_are_split_among_explorers() -> None:
    stages = _config().stage_configs()
    assert explorer_threads(stages, explorers=1, cores=8) == 8
    assert explorer_threads(stages, explorers=3, cores=8) == 2
    assert explorer_threads(stages, explorers=4, cores=2) == 1


def test_an_explicit_setting_wins_in_any_stage() -> None:
    chosen = _config(stages=({"explorer": {"threads": 3}},))
    assert explorer_threads(chosen.stage_configs(), explorers=1, cores=8) == 3


def test_an_explorer_overlapping_the_trainer_gets_one_thread() -> None:
    overlapped = _config(synchronizer={"sync_offset": 1, "max_staleness": 1}).stage_configs()
    assert explorer_threads(overlapped, explorers=1, cores=8) == 1
    explicit = _config(synchronizer={"sync_offset": 1, "max_staleness": 1}, explorer={"threads": 4})
    assert explorer_threads(explicit.stage_configs(), explorers=1, cores=8) == 4


def test_an_explore_only_run_keeps_the_cores() -> None:
    explore = _config(mode="explore", synchronizer={"sync_offset": 1, "max_staleness": 1}).stage_configs()
    assert explorer_threads(explore, explorers=1, cores=8) == 8
