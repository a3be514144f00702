"""GPU placement under `trinity run`: `trainer.devices` and `explorer.devices` become each process's
CUDA_VISIBLE_DEVICES; overlapping or impossible placements exit 2 naming the field, unless colocation is asked for."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from tests.cli.test_check import Done
from tests.cli.test_check import trinity as trinity  # the fixture, shared
from tests.cli.test_preflight import BAD_INPUT, _config
from tests.cli.test_preflight import files as files  # the fixture, shared
from trinity.cli.placement import visible_devices
from trinity.config import ConfigError, RunConfig
from trinity.config.errors import format_validation_error


def _run(trainer: dict[str, Any] | None = None, explorer: dict[str, Any] | None = None, **more: Any) -> RunConfig:
    data = {
        "model": {"path": "m"},
        "buffer": {"taskset": {"path": "t.jsonl"}},
        "trainer": trainer or {},
        "explorer": explorer or {},
        **more,
    }
    return RunConfig.model_validate(data)


def _refusal(**sections: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        _run(**sections)
    return format_validation_error(caught.value)


def test_each_process_sees_only_its_own_gpus() -> None:
    config = _run({"devices": [0, 1], "data_parallel_size": 2}, {"devices": [2, 3, 4, 5], "num_workers": 2})
    assert visible_devices([config], explorers=2) == {"trainer": "0,1", "explorer-0": "2,3", "explorer-1": "4,5"}


def test_an_unset_section_keeps_the_launchers_gpus_and_an_empty_one_gets_none() -> None:
    assert visible_devices([_run()], explorers=1) == {}
    assert visible_devices([_run({"devices": []})], explorers=1) == {"trainer": ""}


def test_indices_are_the_launchers_own_visible_gpus() -> None:
    config = _run({"devices": [1]}, {"devices": [0]})
    assert visible_devices([config], explorers=1, launcher="4,6") == {"trainer": "6", "explorer-0": "4"}
    with pytest.raises(ConfigError, match=r"explorer.devices: GPU\(s\) \[2\] are not among the 2 this launcher sees"):
        visible_devices([_run({"devices": [1]}, {"devices": [2]})], explorers=1, launcher="4,6")


def test_overlapping_devices_are_refused_naming_the_field() -> None:
    message = _refusal(trainer={"devices": [0, 1]}, explorer={"devices": [1, 2]})
    assert message.startswith("explorer.devices: GPUs [1] overlaps trainer.devices")
    assert "explorer.colocate: true" in message


def test_an_unset_section_overlaps_every_gpu_the_other_names() -> None:
    assert _refusal(trainer={"devices": [0]}).startswith("explorer.devices: GPUs [0] overlaps trainer.devices")


def test_colocation_asked_for_allows_shared_gpus() -> None:
    config = _run({"devices": [0]}, {"devices": [0], "colocate": True})
    assert visible_devices([config], explorers=1) == {"trainer": "0", "explorer-0": "0"}


def test_a_gpu_named_twice_in_one_section_is_refused() -> None:
    assert _refusal(explorer={"devices": [1, 1]}).startswith("explorer.devices: [1, 1] names a GPU more than once")


def test_a_negative_gpu_index_is_refused() -> None:
    assert _refusal(trainer={"devices": [-1]}).startswith("trainer.torch.devices: [-1]: a GPU index is 0 or more")


def test_explorer_gpus_must_split_evenly() -> None:
    config = _run({"devices": [0]}, {"devices": [1, 2, 3], "num_workers": 2})
    with pytest.raises(ConfigError, match=r"explorer.devices: 3 GPU\(s\) do not split evenly among 2 explorers"):
        visible_devices([config], explorers=2)


def test_each_worker_of_a_tensor_parallel_explorer_needs_a_gpu() -> None:
    split = {"engine_options": {"tensor_parallel_size": 2}}
    config = _run({"devices": [0]}, {"devices": [1, 2, 3, 4], "num_workers": 2, **split})
    assert visible_devices([config], explorers=2) == {"trainer": "0", "explorer-0": "1,2", "explorer-1": "3,4"}
    config = _run({"devices": [0]}, {"devices": [1, 2], "num_workers": 2, **split})
    with pytest.raises(ConfigError, match=r"explorer.devices: 1 GPU\(s\) per explorer for an engine split across 2"):
        visible_devices([config], explorers=2)


@pytest.mark.parametrize(
    ("synchronizer", "message"),
    [
        ({"method": "checkpoint"}, "synchronizer.method: 'checkpoint' cannot reach an engine split across 2 workers"),
        ({"method": "cuda_ipc"}, "synchronizer.method: 'cuda_ipc' cannot reach an engine split across 2 workers"),
        ({"explorer_receive": "staged"}, "synchronizer.explorer_receive: 'staged' holds a version in the explorer"),
    ],
)
def test_a_tensor_parallel_explorer_refuses_what_its_worker_ranks_cannot_do(synchronizer, message) -> None:
    explorer = {"engine_options": {"tensor_parallel_size": 2}}
    assert _refusal(explorer=explorer, synchronizer=synchronizer).startswith(message)


def test_parallel_sizes_go_through_their_own_option_not_extra() -> None:
    message = _refusal(explorer={"engine_options": {"extra": {"tensor_parallel_size": 2}}})
    assert "tensor_parallel_size is set by Trinity, not through extra (use engine_options.tensor_parallel_size)" in (
        message
    )


def test_each_local_trainer_rank_needs_a_gpu() -> None:
    config = _run({"devices": [0], "data_parallel_size": 2}, {"devices": [1]})
    with pytest.raises(ConfigError, match=r"trainer.devices: 1 GPU\(s\) for 2 local trainer ranks"):
        visible_devices([config], explorers=1)


def test_a_stage_may_not_move_the_processes() -> None:
    config = _run({"devices": [0]}, {"devices": [1]}, stages=[{"explorer": {"devices": [2]}}])
    with pytest.raises(ConfigError, match=r"stages\[0\].explorer.devices: \(2,\) differs from the run's \(1,\)"):
        visible_devices(config.stage_configs(), explorers=1)


def test_trinity_check_exits_2_on_overlapping_devices(trinity: Callable[..., Done], files: dict[str, Path]) -> None:
    done = trinity("check", "--config", str(_config(files, **{"trainer.devices": [0], "explorer.devices": [0]})))
    assert done.returncode == BAD_INPUT
    assert "explorer.devices: GPUs [0] overlaps trainer.devices" in done.stderr


def test_trinity_run_exits_2_on_overlapping_devices_before_starting_anything(
    trinity: Callable[..., Done], files: dict[str, Path]
) -> None:
    config = _config(files, **{"trainer.devices": [0, 1], "explorer.devices": [1]})
    done = trinity("run", "--config", str(config), "--output", str(files["dir"] / "out"))
    assert done.returncode == BAD_INPUT
    assert "explorer.devices: GPUs [1] overlaps trainer.devices" in done.stderr
    assert not (files["dir"] / "out").exists()


def test_trinity_check_exits_2_on_an_uneven_explorer_split(
    trinity: Callable[..., Done], files: dict[str, Path]
) -> None:
    changes = {"trainer.devices": [0], "explorer.devices": [1, 2, 3], "explorer.num_workers": 2}
    done = trinity("check", "--config", str(_config(files, **changes)))
    assert done.returncode == BAD_INPUT
    assert "explorer.devices: 3 GPU(s) do not split evenly among 2 explorers" in done.stderr


@pytest.mark.system
def test_the_launched_processes_receive_their_gpus(tmp_path: Path) -> None:
    """The environment each real process of the stack was started with (read back from /proc), ~50 s on 2 cores."""
    from trinity.cli.launcher import LocalStack

    devices = {"trainer": "0", "explorer-0": "1,2", "explorer-1": "3,4"}
    stack = LocalStack.up(tmp_path, roles=("gateway", "trainer", "explorer"), explorers=2, visible_devices=devices)
    try:
        seen = {
            name: psutil.Process(handle.process.pid).environ().get("CUDA_VISIBLE_DEVICES")
            for name, handle in stack.services.items()
            if handle.process is not None
        }
    finally:
        stack.down()
    assert seen == {"gateway": os.environ.get("CUDA_VISIBLE_DEVICES"), **devices}  # the gateway: the launcher's
