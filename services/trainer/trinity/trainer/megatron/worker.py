"""The entry point of each Megatron worker process, and the command loop that runs on all ranks.

Rank 0 talks to the caller over a pipe: it receives `(command, args)`, broadcasts it to the other ranks
over a gloo group (whose timeout is effectively unbounded, so an idle trainer waiting for data does not
time out), every rank runs the command on its `MegatronEngine`, and rank 0 sends back the result.
Any exception is sent to the caller (rank 0 by pipe, every rank by the error queue) and ends the
process: the caller then stops the whole group, so no rank is left waiting in a collective.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import Any

from trinity.config import MegatronTrainerConfig, RunConfig
from trinity.trainer.ranks.processes import die_with_parent

WORKER_ENV = "TRINITY_MEGATRON_WORKER"
_IDLE_TIMEOUT = timedelta(days=365)


def run_worker(
    rank: int,
    master_port: int,
    config: RunConfig,
    algorithm_factory: Any,
    conn: Any,
    errors: Any,
    parent_pid: int,
) -> None:
    """Process target: set up torch.distributed + Megatron, build the engine, serve commands.

    `config.trainer` is the run's `MegatronTrainerConfig` (world size, rendezvous, timeouts, threads)."""
    die_with_parent(parent_pid)
    trainer = config.trainer
    assert isinstance(trainer, MegatronTrainerConfig)
    os.environ.update(
        {
            "MASTER_ADDR": trainer.master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(trainer.world_size),
            "LOCAL_RANK": str(rank),
            WORKER_ENV: "1",
            "OMP_NUM_THREADS": str(trainer.threads_per_worker),
        }
    )
    try:
        import torch

        torch.set_num_threads(trainer.threads_per_worker)
        _serve(rank, config, trainer, algorithm_factory, conn)
    except BaseException:  # noqa: BLE001 (any failure must reach the caller before the process ends)
        tb = traceback.format_exc()
        try:
            errors.put((rank, tb))
            if conn is not None:
                conn.send(("error", f"rank {rank}: {tb}"))
        except Exception:  # noqa: BLE001 (the caller may be gone; the exit code still tells)
            pass
        os._exit(1)


def _serve(rank: int, config: RunConfig, trainer: MegatronTrainerConfig, algorithm_factory: Any, conn: Any) -> None:
    import torch
    import torch.distributed as dist

    from trinity.trainer.algorithm import build_algorithm
    from trinity.trainer.megatron import cpu_compat
    from trinity.trainer.megatron.engine import MegatronEngine, set_control_group
    from trinity.v1 import common_pb2

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        cpu_compat.apply()
    backend = trainer.distributed_backend or ("nccl" if on_gpu else "gloo")
    dist.init_process_group(
        backend, rank=rank, world_size=trainer.world_size, timeout=timedelta(seconds=trainer.collective_timeout_s)
    )
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(
        trainer.tensor_parallel_size,
        trainer.pipeline_parallel_size,
        distributed_timeout_minutes=max(1, int(trainer.collective_timeout_s // 60)),
    )
    model_parallel_cuda_manual_seed(config.seed)
    torch.manual_seed(config.seed)
    commands = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
    set_control_group(dist.new_group(backend="gloo", timeout=timedelta(seconds=trainer.collective_timeout_s)))

    algorithm = algorithm_factory() if algorithm_factory is not None else build_algorithm(config.algorithm)
    engine = MegatronEngine(config, algorithm)
    dist.barrier(group=commands)
    if rank == 0:
        conn.send(("ready", None))

    while True:
        box: list[Any] = [conn.recv() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=commands)
        command, args = box[0]
        if command == "shutdown":
            break
        if command == "train_step":
            result: Any = engine.train_step([common_pb2.Experience.FromString(b) for b in args[0]])
        elif command == "score":
            result = engine.score([common_pb2.Experience.FromString(b) for b in args[0]])
        elif command == "save_checkpoint":
            result = str(engine.save_checkpoint(args[0], args[1]))
        elif command == "load_checkpoint":
            engine.load_checkpoint(args[0])
            result = engine.state.model_version
        elif command == "continue_versions_after":
            result = engine.state.continue_versions_after(args[0])
        elif command == "named_weights":
            for item in engine.export_weights():
                conn.send(("item", item))
            result = None
        else:
            raise ValueError(f"unknown worker command {command!r}")
        if rank == 0:
            conn.send(("ok", result))
    if rank == 0:
        conn.send(("ok", None))
    dist.barrier(group=commands)
    dist.destroy_process_group()
