"""One trainer rank for the data-parallel tests: train a few steps on a fixed batch, write what it ended with.

`python dp_worker.py RANK WORLD PORT JSON_ARGS`: joins a gloo group of WORLD ranks at 127.0.0.1:PORT (none
for WORLD 1), builds the torch backend on the tiny model, optionally loads a checkpoint, trains `steps`
steps, optionally checkpoints, and rank 0 writes the metrics and full weights to `out` (torch.save).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from trainer_helpers import grouped_rollouts, preference_pairs, run_config  # the script's folder is on sys.path

from trinity.trainer.torch_backend import TorchBackend


def batch(algorithm: str, step: int) -> list:
    if algorithm == "dpo":
        return preference_pairs(f"-s{step}")
    exps = grouped_rollouts(4, 4, seed=step)
    for e in exps:
        e.id = f"{e.id}-s{step}"
    return exps


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    args = json.loads(sys.argv[4])
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
    config = run_config(
        Path(args["model"]),
        args["algorithm"],
        data_parallel_size=world,
        algorithm_fields=args.get("algorithm_fields"),  # a teacher, a KL controller
        **args["trainer"],
    )
    backend = TorchBackend(config, Path(args["checkpoint_dir"]) if args.get("checkpoint_dir") else None)
    if args.get("load"):
        backend.load_checkpoint(args["load"])
    metrics = [backend.train_step(batch(args["algorithm"], backend.step)) for _ in range(args["steps"])]
    if args.get("save"):
        backend.save_checkpoint(args["save"])
    weights = {name: t.cpu() for name, t in backend.named_weights()}
    if rank == 0:
        torch.save({"metrics": metrics, "weights": weights, "step": backend.step}, args["out"])
    if world > 1:
        # No rank leaves while another still talks to it: a gloo peer that exits mid-teardown aborts the other.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
