"""One rank of a data-parallel (FSDP2, gloo) trainer for the sharded-sync test.

`python -m tests.sync.sharded_trainer RANK WORLD PORT JSON_ARGS`: joins the trainers' gloo group, builds the
torch backend on the model; rank 0 reserves a sync group for `explorers` receivers, writes its spec to
`spec_file`, publishes `backend.named_weights()` as version 1 through `WeightSender` (digest in the same pass)
and writes the report to `out`; the other ranks iterate their `named_weights()` to the end (the gathers are
collectives of every rank).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trainer.trainer_helpers import run_config
from trinity.models.digest import WeightsDigest
from trinity.sync import SyncGroupSpec, reserve_rendezvous
from trinity.sync.collective import WeightSender
from trinity.trainer.torch_backend import TorchBackend


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    args = json.loads(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    backend = TorchBackend(run_config(Path(args["model"]), data_parallel_size=world))
    if rank != 0:
        for _ in backend.named_weights():
            pass
        dist.destroy_process_group()
        return
    explorers = [f"explorer-{i}" for i in range(args["explorers"])]
    spec = SyncGroupSpec.for_members(args["name"], 0, explorers, bucket_mb=args["bucket_mb"], timeout_s=60)
    rendezvous = reserve_rendezvous(spec)
    spec_file = Path(args["spec_file"])
    spec_file.with_suffix(".tmp").write_text(rendezvous.spec.model_dump_json())
    spec_file.with_suffix(".tmp").rename(spec_file)  # the test spawns the receivers once it appears
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    digest = WeightsDigest()
    report = sender.publish(1, digest.observe(backend.named_weights()))
    sender.close()
    result = {
        "sharded": backend.ranks.sharded,
        "refused": report.refused,
        "tensors": report.tensors,
        "buckets": report.buckets,
        "digest": digest.value,
    }
    Path(args["out"]).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
