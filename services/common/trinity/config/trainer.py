"""The trainer section of the run config: backend, optimizer, batching, checkpoints, parallelism.

`trainer.backend` picks the shape of the section: `torch` (the default when `backend` is omitted) has
prompt sharing, autocast, gradient checkpointing and LoRA; `megatron` has tensor/pipeline parallelism
and its worker processes. A key of the other backend is an error, not silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from trinity.config.base import _check_devices, _Section


class OptimizerSection(_Section):
    """AdamW with a learning-rate schedule; `lr` is the peak rate the schedule reaches."""

    lr: float = Field(default=1e-6, gt=0, description="peak learning rate of the policy")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW (beta1, beta2)")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW decoupled weight decay, on every parameter")
    schedule: Literal["constant", "warmup", "cosine"] = Field(
        default="constant", description="lr schedule; cosine reaches min_lr_ratio * lr after buffer.total_steps updates"
    )
    warmup_steps: int = Field(default=0, ge=0, description="updates of linear warmup (warmup and cosine schedules)")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="cosine: the final lr as a fraction of lr")
    max_grad_norm: float | None = Field(default=1.0, gt=0, description="gradient clipping norm; None = no clipping")
    critic_lr: float | None = Field(default=None, gt=0, description="PPO critic learning rate; None = lr")


class _TrainerSection(_Section):
    """What both backends read."""

    optimizer: OptimizerSection = Field(default=OptimizerSection(), description="AdamW and its lr schedule")
    micro_batch_tokens: int = Field(default=8192, gt=0, description="padded tokens per forward/backward pass")
    mini_batch_size: int | None = Field(
        default=None, gt=0, description="experiences per optimizer update; None = the whole train batch"
    )
    ppo_epochs: int = Field(default=1, gt=0, description="passes over each train batch")
    recompute_old_logprobs: bool = Field(
        default=False,
        description="use the trainer's own log-probs as old log-probs instead of the sampler's (free when a step "
        "makes one update: they are then the policy's own in that update)",
    )
    save_interval: int = Field(
        default=10,
        ge=0,
        description="checkpoint every N train steps (a lost trainer redoes at most N); 0 = only at the end",
    )
    keep_checkpoints: int = Field(default=2, gt=0, description="checkpoints kept on disk (the newest)")
    threads: int = Field(default=0, ge=0, description="torch threads; 0 = decided by the launcher")
    data_parallel_size: int = Field(
        default=1, ge=1, description="data-parallel ranks; each trains its share of every mini-batch"
    )
    distributed_backend: Literal["nccl", "gloo"] | None = Field(
        default=None, description="torch.distributed backend of the ranks; None = nccl with a GPU, gloo without"
    )
    master_addr: str = Field(
        default="127.0.0.1", description="rendezvous address of the ranks (the host of rank 0, reachable by all)"
    )
    master_port: int | None = Field(default=None, gt=0, lt=65536, description="rendezvous port; None = a free port")
    start_timeout_s: float = Field(default=300.0, gt=0, description="limit on rank start-up (model load, joining)")
    command_timeout_s: float = Field(default=1800.0, gt=0, description="limit on one train step, save or export")
    collective_timeout_s: float = Field(default=600.0, gt=0, description="torch.distributed collective timeout")
    devices: tuple[int, ...] | None = Field(
        default=None,
        description="`trinity run`: GPUs (indices on the host) the trainer process and its local ranks see "
        "(CUDA_VISIBLE_DEVICES; one per local rank at least); [] = none; unset = every GPU",
    )

    _devices = field_validator("devices")(_check_devices)


class TorchTrainerConfig(_TrainerSection):
    """The PyTorch backend (`trinity.trainer.torch_backend`): one process, or FSDP2 over `data_parallel_size` ranks."""

    backend: Literal["torch"] = Field(default="torch", description="the training backend")
    share_prompts: bool = Field(
        default=True, description="samples with the same prompt share one row (the prompt is computed once)"
    )
    autocast: Literal["none", "bfloat16"] = Field(
        default="none", description="bf16 matmuls over fp32 weights (about 2x faster on CPUs with AVX-512 BF16 or AMX)"
    )
    gradient_checkpointing: bool = Field(default=False, description="recompute activations in backward (less memory)")
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="where the policy, reference, critic and optimizer state live: auto (a rank's GPU if it has one), "
        "cpu, cuda or cuda:N",
    )
    weights_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="dtype of the trained weights; auto = bfloat16 on a GPU, model.dtype on a CPU"
    )
    fp32_master_weights: bool | None = Field(
        default=None,
        description="with bfloat16 weights: the optimizer updates float32 master weights, compute runs in bfloat16; "
        "unset = on where the weights are bfloat16 on a GPU (a bf16 AdamW update at lr 1e-6 rounds away), off on a CPU",
    )
    local_ranks: int | None = Field(
        default=None,
        ge=1,
        description="ranks the trainer starts on its own host (0..local_ranks-1); the others join from other "
        "hosts with the torchrun environment; None = all of them",
    )
    logprob_chunk_size: int = Field(
        default=1024,
        gt=0,
        description="response positions, over a micro-batch's rows, per lm_head/log-softmax chunk (bounds the "
        "[chunk, vocab] logits; past one chunk the head is recomputed in backward)",
    )
    value_loss_coef: float = Field(default=0.5, ge=0, description="weight of the PPO critic loss")
    lora_rank: int = Field(default=0, ge=0, description="LoRA adapter rank; 0 = full fine-tuning")
    lora_alpha: int | None = Field(default=None, gt=0, description="LoRA scaling numerator; None = 2 * lora_rank")
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on the LoRA adapters' input")
    lora_target_modules: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        description="module names that get LoRA adapters",
    )

    @model_validator(mode="after")
    def _local_ranks_within_world(self) -> TorchTrainerConfig:
        if self.local_ranks is not None and self.local_ranks > self.data_parallel_size:
            raise ValueError(
                f"trainer.local_ranks: {self.local_ranks} exceeds trainer.data_parallel_size "
                f"({self.data_parallel_size}); a host starts at most the run's ranks"
            )
        return self


class MegatronTrainerConfig(_TrainerSection):
    """Megatron-Core over `tensor_parallel_size * pipeline_parallel_size * data_parallel_size` workers."""

    backend: Literal["megatron"] = Field(description="the training backend")
    tensor_parallel_size: int = Field(default=1, ge=1, description="TP degree: splits heads, MLP and vocab")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="PP degree: splits layers (1F1B schedule)")
    use_distributed_optimizer: bool = Field(
        default=False, description="shard optimizer state over the data-parallel ranks (Megatron's ZeRO-1)"
    )
    threads_per_worker: int = Field(default=1, gt=0, description="torch threads of each worker process")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


def _backend_of(value: Any) -> str:
    # A section written without `backend` (every example config) is the torch backend's.
    if isinstance(value, dict):
        return str(value.get("backend", "torch"))
    return str(getattr(value, "backend", "torch"))


TrainerConfig = Annotated[
    Annotated[TorchTrainerConfig, Tag("torch")] | Annotated[MegatronTrainerConfig, Tag("megatron")],
    Discriminator(
        _backend_of,
        custom_error_type="unknown_backend",
        custom_error_message="backend must be 'torch' or 'megatron'",
    ),
]
