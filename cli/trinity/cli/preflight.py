"""Checks a command makes before it starts anything, so that a bad config exits 2 in a second, naming the field.

Parsing a config already checks every registry name in it (workflow, reward, algorithm, operators, ...:
`trinity.config.registered`); what parsing leaves for later is added here:
- the stage overlays, which are merged and validated only when the stages are built;
- for `trinity run` and `trinity bench`, the files the config names on this machine: the model directory and
  every task set and offline data file, of every stage; and the GPUs each process is given (`placement`).

`trinity submit` checks the stages but no files: the buffer and the explorers read the files on their own
machines (a compose stack sees `/examples`, this machine may not), so a file missing here proves nothing there,
and the buffer refuses a missing or unreachable one itself, naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from trinity.cli.placement import VISIBLE, visible_devices
from trinity.config import RunConfig
from trinity.config.errors import ConfigError
from trinity.config.resolved import resolved_run


def local_run(config: RunConfig) -> RunConfig:
    """`config`, once every stage validates and every file it names exists here; ConfigError naming one otherwise."""
    from trinity.models import BUILTIN_MODELS

    submitted_run(config)
    for prefix, stage in _stages(config):
        model = stage.model.path
        if model not in BUILTIN_MODELS and not Path(model).is_dir():
            raise ConfigError(
                f"{prefix}model.path", f"no such directory: {model} (a Hugging Face model, or one of {BUILTIN_MODELS})"
            )
        for field, path in _data_files(stage, prefix):
            if not Path(path).exists():
                raise ConfigError(field, f"no such file: {path}")
    process_devices(config.stage_configs())
    return config


def process_devices(stages: Sequence[RunConfig]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of each process `trinity run` starts for `stages` that sets it (`placement`)."""
    explorers = max(stage.explorer.num_workers for stage in stages)
    return visible_devices(stages, explorers, os.environ.get(VISIBLE))


def submitted_run(config: RunConfig) -> RunConfig:
    """`config`, once every stage validates and resolves (the gateway's machines check the files)."""
    resolved_run(config)
    return config


def data_roots_env(stages: Sequence[RunConfig], output: Path) -> dict[str, str]:
    """The services' environment of `trinity run`: the data roots are the files the stages name, the folders their
    tasks' files are read from (a `textworld` run's `games_dir`, where tasks' `payload.game_file`s may lie) and the
    output folder, nothing else on this machine."""
    paths = [os.path.realpath(path) for stage in stages for _, path in _data_files(stage, "")]
    paths += [os.path.realpath(folder) for stage in stages for folder in _task_file_folders(stage)]
    return {"TRINITY_DATA_ROOTS": os.pathsep.join(dict.fromkeys([*paths, str(output)]))}


def _task_file_folders(config: RunConfig) -> Iterator[str]:
    games_dir = getattr(config.explorer.workflow_options, "games_dir", "")
    if config.explorer.workflow == "textworld" and games_dir:
        yield games_dir


def _stages(config: RunConfig) -> Iterator[tuple[str, RunConfig]]:
    """(field prefix, config) of each stage; stage k > 0 is the overlay `stages[k-1]` merged over the ones before."""
    for index, stage in enumerate(config.stage_configs()):
        yield ("" if index == 0 else f"stages[{index - 1}]."), stage


def _data_files(config: RunConfig, prefix: str) -> Iterator[tuple[str, str]]:
    """(field, path) of each file the run reads; a generated task set (source reasoning_gym) reads none."""
    buffer = config.buffer
    if buffer.taskset is not None and buffer.taskset.path:
        yield f"{prefix}buffer.taskset.path", buffer.taskset.path
    for i, taskset in enumerate(buffer.tasksets):
        if taskset.path:
            yield f"{prefix}buffer.tasksets[{i}].path", taskset.path
    for i, taskset in enumerate(buffer.eval_tasksets):
        if taskset.path:
            yield f"{prefix}buffer.eval_tasksets[{i}].path", taskset.path
    if buffer.offline_data is not None:
        yield f"{prefix}buffer.offline_data.path", buffer.offline_data.path
