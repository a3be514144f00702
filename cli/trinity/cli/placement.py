"""Which GPUs each process of `trinity run` sees: `trainer.devices` and `explorer.devices` as CUDA_VISIBLE_DEVICES.

A process sees only its own GPUs, so its `cuda:0` is its first one: the trainer's local ranks take `cuda:LOCAL_RANK`
of the trainer's devices, and explorer i the i-th equal share of the explorers' devices (several for an engine with
tensor parallelism). A section without `devices` leaves the variable as the launcher has it (every GPU). The config
schema already refuses devices shared between the sections unless `explorer.colocate` is set.

Indices are the launcher's: where its own CUDA_VISIBLE_DEVICES is set, index i is the i-th GPU listed there.
"""

from __future__ import annotations

from collections.abc import Sequence

from trinity.config import RunConfig, TorchTrainerConfig
from trinity.config.errors import ConfigError

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_devices(stages: Sequence[RunConfig], explorers: int, launcher: str | None = None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of each process ("trainer", "explorer-0", ...) whose section sets devices; `explorers`
    processes are started and `launcher` is the launcher's own CUDA_VISIBLE_DEVICES. ConfigError naming the field
    where the stages disagree, the trainer has fewer GPUs than local ranks, the explorers' GPUs do not split evenly,
    or an index is not a GPU the launcher sees."""
    first = stages[0]
    for index, stage in enumerate(stages[1:]):
        for field, mine, base in (
            ("trainer.devices", stage.trainer.devices, first.trainer.devices),
            ("explorer.devices", stage.explorer.devices, first.explorer.devices),
            ("explorer.colocate", stage.explorer.colocate, first.explorer.colocate),
        ):
            if mine != base:
                raise ConfigError(
                    f"stages[{index}].{field}",
                    f"{mine} differs from the run's {base}: `trinity run` places its processes once, for every stage",
                )
    out: dict[str, str] = {}
    trainer = first.trainer.devices
    if trainer is not None:
        ranks = max(_local_ranks(stage) for stage in stages)
        if trainer and len(trainer) < ranks:
            raise ConfigError(
                "trainer.devices",
                f"{len(trainer)} GPU(s) for {ranks} local trainer ranks: each rank needs a GPU of its own",
            )
        out["trainer"] = _listed(trainer, "trainer.devices", launcher)
    explorer = first.explorer.devices
    if explorer is not None:
        if len(explorer) % explorers:
            raise ConfigError(
                "explorer.devices",
                f"{len(explorer)} GPU(s) do not split evenly among {explorers} explorers (explorer.num_workers)",
            )
        share = len(explorer) // explorers
        workers = getattr(first.explorer.engine_options, "tensor_parallel_size", 1)
        if share < workers:
            raise ConfigError(
                "explorer.devices",
                f"{share} GPU(s) per explorer for an engine split across {workers} workers "
                "(explorer.engine_options.tensor_parallel_size): each worker needs a GPU of its own",
            )
        for i in range(explorers):
            out[f"explorer-{i}"] = _listed(explorer[i * share : (i + 1) * share], "explorer.devices", launcher)
    return out


def _local_ranks(stage: RunConfig) -> int:
    """Trainer processes on this host: the torch backend's local ranks, or every Megatron worker."""
    trainer = stage.trainer
    if isinstance(trainer, TorchTrainerConfig):
        return trainer.local_ranks or trainer.data_parallel_size
    return trainer.world_size


def _listed(devices: Sequence[int], field: str, launcher: str | None) -> str:
    if launcher is None:
        return ",".join(map(str, devices))
    seen = [d.strip() for d in launcher.split(",") if d.strip()]
    missing = [d for d in devices if d >= len(seen)]
    if missing:
        raise ConfigError(
            field, f"GPU(s) {missing} are not among the {len(seen)} this launcher sees ({VISIBLE}={launcher!r})"
        )
    return ",".join(seen[d] for d in devices)
