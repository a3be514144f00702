"""Settings of the Megatron-Core backend that `TrainerSettings` does not (yet) have (pydantic, no torch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MegatronSettings(BaseModel):
    """Model parallelism and process management of the Megatron backend.

    World size is `tensor_parallel_size * pipeline_parallel_size` (data parallelism is 1: the RL batch
    is split into micro-batches by `TrainerSettings.micro_batch_tokens`, as in the PyTorch backend).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel_size: int = Field(1, gt=0, description="TP degree: splits heads, MLP and vocab")
    pipeline_parallel_size: int = Field(1, gt=0, description="PP degree: splits layers (1F1B schedule)")
    distributed_backend: str | None = Field(None, description="None = nccl with a GPU, gloo without")
    master_addr: str = "127.0.0.1"
    master_port: int | None = Field(None, gt=0, lt=65536, description="None = a free port")
    start_timeout_s: float = Field(300.0, gt=0, description="worker start-up (model load) limit")
    command_timeout_s: float = Field(1800.0, gt=0, description="limit on one train step / save / export")
    collective_timeout_s: float = Field(600.0, gt=0, description="torch.distributed collective timeout")
    threads_per_worker: int = Field(1, gt=0, description="torch threads of each worker process")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size
