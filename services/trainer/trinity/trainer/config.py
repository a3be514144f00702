"""Settings of the Trainer's training core (pydantic v2; no torch import here).

This is a local schema; it is meant to be folded into the shared `trinity.config` run config, so it
stays plain data with `extra="forbid"` so that a misspelled key fails validation instead of being ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraSettings(_Strict):
    """Low-rank adapters (peft). The exported weights are always merged, full-rank tensors."""

    rank: int = Field(8, gt=0)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class OptimizerSettings(_Strict):
    """AdamW with a learning-rate schedule; `lr` is the peak rate the schedule reaches."""

    lr: float = Field(1e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    schedule: Literal["constant", "warmup", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    total_steps: int = Field(1000, gt=0, description="cosine decays to min_lr_ratio * lr at this step")
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    max_grad_norm: float | None = Field(1.0, gt=0, description="None disables clipping")
    critic_lr: float | None = Field(None, gt=0, description="PPO critic rate; None = lr")


class TrainerSettings(_Strict):
    """What the PyTorch training backend needs to train one policy with one algorithm."""

    backend: str = Field("torch", description="registry name of the TrainerBackend")
    model_path: str = Field(..., description="Hugging Face causal-LM directory (config + safetensors)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    autocast: Literal["none", "bfloat16"] = Field(
        "none",
        description="mixed precision: fp32 master weights, bf16 matmuls (about 2x faster with AVX-512 BF16 or AMX)",
    )
    algorithm: str = Field("grpo", description="algorithm preset name (trinity.algorithms.preset)")
    algorithm_overrides: dict[str, dict[str, float | int | str | bool]] = Field(
        default_factory=dict,
        description="hyperparameter overrides per part: 'advantage', 'policy_loss', 'entropy', 'value_loss'",
    )
    kl_coef: float | None = Field(None, ge=0, description="KL-loss weight; None = the preset's kl_loss_coef")
    entropy_coef: float | None = Field(None, description="None = the preset's entropy term default")
    value_loss_coef: float = Field(0.5, ge=0, description="weight of the PPO critic loss")
    lora: LoraSettings | None = None
    optimizer: OptimizerSettings = Field(default_factory=OptimizerSettings)

    micro_batch_tokens: int = Field(8192, gt=0, description="padded tokens per forward/backward pass")
    share_prompts: bool = Field(
        True, description="samples with the same prompt share one row: the prompt is computed once per group"
    )
    mini_batch_size: int | None = Field(None, gt=0, description="experiences per optimizer update; None = all")
    ppo_epochs: int = Field(1, gt=0)
    logprob_chunk_size: int = Field(256, gt=0, description="sequence positions per log-softmax chunk")
    logprob_temperature: float = Field(1.0, gt=0, description="the rollout sampling temperature")
    recompute_old_logprobs: bool = Field(
        False, description="use the trainer's own log-probs as old log-probs instead of the sampler's"
    )
    max_staleness: int | None = Field(
        None, ge=0, description="drop experiences with step - model_version above this; None = keep all"
    )
    max_seq_len: int | None = Field(None, gt=0, description="longer samples are truncated on the response side")
    gradient_checkpointing: bool = False
    tensor_parallel_size: int = Field(1, gt=0, description="megatron backend: tensor-parallel degree")
    pipeline_parallel_size: int = Field(1, gt=0, description="megatron backend: pipeline-parallel degree")

    checkpoint_dir: str | None = None
    save_interval: int = Field(0, ge=0, description="save every N steps; 0 = only on demand")
    keep_checkpoints: int = Field(2, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _warmup_fits(self) -> TrainerSettings:
        opt = self.optimizer
        if opt.schedule == "cosine" and opt.warmup_steps >= opt.total_steps:
            raise ValueError("optimizer.warmup_steps must be below optimizer.total_steps for a cosine schedule")
        if self.save_interval and not self.checkpoint_dir:
            raise ValueError("save_interval needs checkpoint_dir")
        return self
