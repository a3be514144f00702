"""Building the Megatron-Core policy (GPTModel, local layer spec), its DDP wrapper and optimizer.

Must run inside an initialized `torch.distributed` + `megatron.core.parallel_state` (see `worker.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from trinity.config import OptimizerSection
from trinity.trainer.megatron.hf_mapping import ModelShape, hf_to_megatron, shape_from_hf_config

if TYPE_CHECKING:  # megatron-core is imported inside the worker processes only
    from megatron.core.distributed import DistributedDataParallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_shape(model_path: str | Path) -> ModelShape:
    return shape_from_hf_config(json.loads((Path(model_path) / "config.json").read_text()))


def transformer_config(shape: ModelShape, dtype: str, tp: int, pp: int, on_gpu: bool) -> Any:
    """A `TransformerConfig` equal in function to the HF model: RMSNorm, SwiGLU, RoPE, GQA, no dropout.

    Fusions are off (they need TE/apex/CUDA kernels, and exact parity with the PyTorch backend matters
    more here); `variable_seq_lengths` lets pipeline stages exchange micro-batches of varying shape.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch_dtype = DTYPES[dtype]
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch_dtype,
        params_dtype=torch_dtype,
        bf16=torch_dtype == torch.bfloat16,
        fp16=torch_dtype == torch.float16,
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",  # only to pass a validation; the model has no MoE
        use_cpu_initialization=not on_gpu,
        # Initialization is wasted work (weights are loaded next), but it is also where Megatron marks
        # parameters as TP-split; without the marks grad-norm and export treat shards as duplicates.
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        calculate_per_token_loss=True,  # the objective scales each micro-batch itself (see engine.py)
    )


def build_gpt(shape: ModelShape, config: Any) -> torch.nn.Module:
    """This rank's GPTModel chunk (its TP shard of its PP stage's layers)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=shape.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def load_hf_weights(model: torch.nn.Module, model_path: str | Path, shape: ModelShape) -> None:
    """Copy this rank's shard of the HF safetensors into `model` (reads only the tensors it needs)."""
    from megatron.core import parallel_state as ps
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_path}")
    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {k: h for h in handles for k in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise KeyError(f"{model_path} has no tensor {name!r}")
        return where[name].get_tensor(name)

    state = hf_to_megatron(
        get,
        shape,
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_rank(),
    )
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    missing, unexpected = own.keys() - state.keys(), state.keys() - own.keys()
    if missing or unexpected:
        raise RuntimeError(f"HF -> Megatron mapping mismatch: {sorted(missing)=} {sorted(unexpected)=}")
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)


def wrap_ddp(model: torch.nn.Module, config: Any, distributed_optimizer: bool) -> DistributedDataParallel:
    """Megatron DDP: grad buffers, summed over the data-parallel group once per mini-batch.

    A sum, not a mean (`calculate_per_token_loss` in `transformer_config`): each micro-batch loss is
    already scaled by its share of the whole mini-batch. The reduction runs once, after the replica's
    last micro-batch (`overlap_grad_reduce` off, Megatron's default).
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed_optimizer
    )
    return DistributedDataParallel(config, ddp_config, model)


def build_optimizer(ddp_model: torch.nn.Module, opt: OptimizerSection, dtype: str, distributed: bool) -> Any:
    """Megatron's optimizer (torch AdamW underneath without TE/apex), decaying every parameter.

    The PyTorch backend applies weight decay to all parameters, so the standard Megatron exemption of
    biases and norms is switched off (`config_overrides={}`) to keep the two backends identical. The
    learning rate is set per update by the engine from `trinity.trainer.optim`'s schedules.
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    torch_dtype = DTYPES[dtype]
    config = OptimizerConfig(
        optimizer="adam",
        lr=opt.lr,
        min_lr=0.0,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.betas[0],
        adam_beta2=opt.betas[1],
        adam_eps=opt.eps,
        # Megatron skips the norm entirely at clip_grad=0; a bound no norm reaches keeps the grad_norm metric.
        clip_grad=opt.max_grad_norm if opt.max_grad_norm is not None else 1e30,
        bf16=torch_dtype == torch.bfloat16,
        fp16=torch_dtype == torch.float16,
        params_dtype=torch_dtype,
        use_distributed_optimizer=distributed,
    )
    return get_megatron_optimizer(config, [ddp_model], config_overrides={})


def _inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers under Megatron's (a `ChainedOptimizer` of one per parameter group kind, or one)."""
    return [chained.optimizer for chained in getattr(optimizer, "chained_optimizers", [optimizer])]


def replica_optimizer_state(optimizer: Any) -> list[dict[str, Any]]:
    """This data-parallel replica's shard of the distributed optimizer: the torch optimizers' states
    (step, moments) and the main parameters they update.

    Megatron's own `save_parameter_state` / `load_parameter_state` (gathered on DP rank 0) cannot load
    back with torch's Adam (no TE/Apex, as on CPU): 0.16.1 looks the per-parameter `step` up in the saved
    shard, which it never saves (KeyError 'step'). Saving each replica's shard as it is avoids the gather too.
    """
    return [
        {
            "state": inner.state_dict(),
            "main_params": [p.detach().clone() for g in inner.param_groups for p in g["params"]],
        }
        for inner in _inner_optimizers(optimizer)
    ]


def load_replica_optimizer_state(optimizer: Any, saved: list[dict[str, Any]]) -> None:
    """Inverse of `replica_optimizer_state`, on the same data-parallel layout."""
    inners = _inner_optimizers(optimizer)
    if len(inners) != len(saved):
        raise ValueError(f"optimizer shard holds {len(saved)} optimizers, this one has {len(inners)}")
    for inner, part in zip(inners, saved, strict=True):
        inner.load_state_dict(part["state"])
        params = [p for g in inner.param_groups for p in g["params"]]
        # With float32 weights the main params are views of the model's leaf params: copy without autograd.
        with torch.no_grad():
            for param, value in zip(params, part["main_params"], strict=True):
                param.copy_(value)
