"""One rank of the cross-host all-reduce: joins a gloo group from the torchrun environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), all-reduces a tensor of `rank + 1`s of the length given as argv[1], prints JSON."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Bounded: a peer that never comes fails the rendezvous instead of hanging the test.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    tensor = torch.full((int(sys.argv[1]),), float(rank + 1))
    dist.all_reduce(tensor)
    print(json.dumps({"rank": rank, "min": tensor.min().item(), "max": tensor.max().item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
