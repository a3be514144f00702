"""The synchronizer section of the run config: how and how often weights go from trainer to explorers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trinity.config.base import _Section

SyncMethod = Literal["auto", "nccl", "cuda_ipc", "gloo", "checkpoint"]
ExplorerReceive = Literal["auto", "staged", "streamed"]


def resolve_explorer_receive(mode: ExplorerReceive, gpu: bool) -> Literal["staged", "streamed"]:
    """`auto`: streamed on a GPU explorer, whose engine already holds most of the device's memory, so a second
    copy of the model can run it out; staged on CPU, where memory is plentiful and receiving beside the rollouts
    keeps the trainer from waiting for a batch to end."""
    if mode == "auto":
        return "streamed" if gpu else "staged"
    return mode


class SynchronizerConfig(_Section):
    """One shape for every method (`checkpoint` only ignores `bucket_mb`), so no union on `method`."""

    method: SyncMethod = Field(
        default="auto",
        description="weight transport; auto = cuda_ipc when every member is on the trainer's GPU, nccl when each "
        "has its own GPU, else gloo",
    )
    sync_interval: int = Field(default=1, ge=1, description="publish weights every N train steps")
    sync_offset: int = Field(default=0, ge=0, description="explorer may run this many steps ahead")
    max_staleness: int | None = Field(
        default=None, ge=0, description="async mode: train on experiences at most this many versions old"
    )
    timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="bound on forming the sync group, on each update, on the wait for the last weights",
    )
    bucket_mb: float = Field(default=64.0, gt=0, description="nccl / gloo: MiB per broadcast")
    explorer_receive: ExplorerReceive = Field(
        default="auto",
        description="staged: an explorer receives and verifies a whole version beside its rollouts, then loads it "
        "between batches (a second copy of the model in memory); streamed: each verified chunk goes straight into "
        "the engine, which pauses its calls for the update (about one bucket extra); auto = streamed on a GPU, "
        "staged on CPU",
    )
