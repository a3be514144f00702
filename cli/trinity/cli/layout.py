"""`trinity check --gpus N --gpu-memory-gib M`: the GPU memory each process of a run needs, and a layout that fits.

Pure arithmetic over the model's `config.json` shape and the run config, for GPUs (the defaults a GPU resolves to:
bf16 sampling, the trainer's fp32 master weights). Estimates, not measurements; the terms (also in deploy/README.md,
"GPUs: placement and layout"):

- parameters: embeddings (and an untied lm_head), per layer q/k/v/o, the gated MLP's three matrices (per expert,
  plus the router and any shared expert, for a mixture of experts) and two norms, and the final norm; biases (a
  vector per matrix at most) are left out.
- trainer rank, torch backend: weights, gradients and AdamW's two moments in the stored dtype (fp32 with master
  weights), all divided by the data-parallel ranks (FSDP2 shards them); a LoRA run keeps gradients and moments for
  the adapters only. Megatron: model.dtype weights, fp32 gradients, fp32 master copy (16-bit weights) and moments,
  divided by tensor x pipeline ranks (the master copy and moments also by data-parallel ranks with the distributed
  optimizer). A reference model adds its weights; a critic adds a second set of weights, gradients and moments.
- activations of one micro-batch of `trainer.micro_batch_tokens` tokens: per token and layer (10 + 24 / TP) x hidden
  x 2 bytes (16-bit compute, no attention matrix: SDPA/flash), one layer's worth with gradient checkpointing (plus
  each layer's input), and the log-prob head's fp32 [chunk, vocab] logits twice.
- explorer engine: the weights in its dtype over its tensor-parallel ranks; the KV cache of one `max_model_len`
  sequence at least, of `max_concurrent_rollouts x group_size` sequences to run as configured; vLLM takes
  `gpu_memory_utilization` of the GPU and caches what its weights leave.

A process fits where its total is at most `HEADROOM` of the GPU (the rest: CUDA context, allocator slack, transient
copies). The layout gives the trainer the fewest GPUs it fits on and the explorers the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trinity.config import RunConfig, TorchTrainerConfig
from trinity.config.algorithm import resolve_algorithm
from trinity.config.errors import ConfigError
from trinity.config.explorer import VllmEngineOptions

GIB = 2**30
HEADROOM = 0.9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LORA_SHAPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TP_DEGREES = (1, 2, 4, 8)  # one host's GPUs at most


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a Hugging Face `config.json` (a multimodal one's `text_config`)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0

    @classmethod
    def read(cls, model_dir: str) -> ModelShape:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError("model.path", f"the layout reads the model's shape from {path}, which does not exist")
        data: dict[str, Any] = json.loads(path.read_text())
        if "hidden_size" not in data and isinstance(data.get("text_config"), dict):
            data = {**data["text_config"], "tie_word_embeddings": data.get("tie_word_embeddings", True)}
        try:
            hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
            return cls(
                hidden=hidden,
                layers=int(data["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(data.get("num_key_value_heads") or heads),
                head_dim=int(data.get("head_dim") or hidden // heads),
                intermediate=int(data["intermediate_size"]),
                vocab=int(data["vocab_size"]),
                tied=bool(data.get("tie_word_embeddings", False)),
                experts=int(data.get("num_experts") or data.get("num_local_experts") or 0),
                expert_intermediate=int(data.get("moe_intermediate_size") or data["intermediate_size"]),
                shared_expert_intermediate=int(data.get("shared_expert_intermediate_size") or 0),
            )
        except KeyError as err:
            raise ConfigError("model.path", f"{path} has no {err.args[0]}: not a decoder-only model's config") from None

    def _projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of a layer, by module name (MLP: a dense one's)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def parameters(self) -> int:
        h = self.hidden
        projections = self._projections()
        attention = sum(a * b for a, b in (projections[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")))
        if self.experts:
            mlp = self.experts * 3 * h * self.expert_intermediate + h * self.experts
            mlp += 3 * h * self.shared_expert_intermediate
        else:
            mlp = 3 * h * self.intermediate
        embeddings = self.vocab * h * (1 if self.tied else 2)
        return embeddings + self.layers * (attention + mlp + 2 * h) + h

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters: rank x (in + out) per targeted projection of each layer (a MoE's as if dense)."""
        shapes = self._projections()
        return self.layers * sum(rank * sum(shapes[t]) for t in targets if t in shapes)

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int) -> int:
        """Keys and values of every layer for one token on one GPU; KV heads are split over the ranks (repeated
        where there are fewer heads than ranks)."""
        heads = max(1, self.kv_heads // tensor_parallel)
        return 2 * self.layers * heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class Memory:
    """Bytes one process needs, by term."""

    terms: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    def fits(self, gpu_bytes: float) -> bool:
        return self.total <= HEADROOM * gpu_bytes

    def describe(self) -> str:
        parts = ", ".join(f"{name} {value / GIB:.2f}" for name, value in self.terms.items() if value)
        return f"{parts}; total {self.total / GIB:.2f} GiB"


def trainer_rank_memory(config: RunConfig, shape: ModelShape, *, data_parallel: int, tensor_parallel: int) -> Memory:
    """One trainer rank's GPU memory with `data_parallel` x `tensor_parallel` ranks (pipeline: the config's)."""
    trainer = config.trainer
    params = shape.parameters
    algorithm = resolve_algorithm(config.algorithm)
    if isinstance(trainer, TorchTrainerConfig):
        weights = trainer.weights_dtype if trainer.weights_dtype != "auto" else "bfloat16"
        master = trainer.fp32_master_weights if trainer.fp32_master_weights is not None else weights == "bfloat16"
        stored = 4 if master or weights == "float32" else 2
        trained = shape.lora_parameters(trainer.lora_rank, trainer.lora_target_modules) if trainer.lora_rank else params
        shards = data_parallel
        terms = {
            "weights": params * stored / shards,
            "gradients": trained * stored / shards,
            "optimizer": 2 * trained * stored / shards,
        }
        if algorithm.needs_reference and not trainer.lora_rank:
            terms["reference"] = params * stored / shards
        checkpointing = trainer.gradient_checkpointing
    else:
        model_split = tensor_parallel * trainer.pipeline_parallel_size
        weight_bytes = DTYPE_BYTES[config.model.dtype]
        states = (0 if weight_bytes == 4 else 4) + 8  # fp32 master copy of 16-bit weights, AdamW's two moments
        state_shards = model_split * (data_parallel if trainer.use_distributed_optimizer else 1)
        terms = {
            "weights": params * weight_bytes / model_split,
            "gradients": params * 4 / model_split,
            "optimizer": params * states / state_shards,
        }
        if algorithm.needs_reference:
            terms["reference"] = params * weight_bytes / model_split
        checkpointing = False
    if config.algorithm.preset.needs_critic:
        terms["critic"] = terms["weights"] + terms["gradients"] + terms["optimizer"]
    tokens = trainer.micro_batch_tokens
    per_layer = tokens * shape.hidden * (10 + 24 / tensor_parallel) * 2
    # Pipelined (1F1B), the first stage holds a micro-batch per stage in flight over its share of the layers: all.
    if checkpointing:
        terms["activations"] = per_layer + shape.layers * tokens * shape.hidden * 2
    else:
        terms["activations"] = per_layer * shape.layers
    chunk = trainer.logprob_chunk_size if isinstance(trainer, TorchTrainerConfig) else tokens
    terms["logits"] = 2 * min(chunk, tokens) * shape.vocab * 4 / tensor_parallel
    return Memory(terms)


@dataclass(frozen=True)
class EngineMemory:
    """One explorer engine's GPU memory: its weights, and the KV cache it must hold and would like to."""

    weights: float
    kv_one_sequence: float
    kv_configured: float
    sequences: int  # the configured concurrency in sequences
    budget: float  # vLLM's share of the GPU (gpu_memory_utilization)

    @property
    def fits(self) -> bool:
        return self.weights + self.kv_one_sequence <= self.budget

    @property
    def sequences_held(self) -> int:
        room = self.budget - self.weights
        return max(0, int(room // self.kv_one_sequence)) if self.kv_one_sequence else 0

    def describe(self) -> str:
        return (
            f"weights {self.weights / GIB:.2f}, KV cache {self.kv_one_sequence / GIB:.2f} per sequence "
            f"({self.kv_configured / GIB:.2f} for the {self.sequences} configured); vLLM's share "
            f"{self.budget / GIB:.2f} GiB holds {self.sequences_held} sequences"
        )


def engine_memory(config: RunConfig, shape: ModelShape, *, tensor_parallel: int, gpu_bytes: float) -> EngineMemory:
    options = config.explorer.engine_options
    dtype_bytes = DTYPE_BYTES[options.dtype or "bfloat16"]
    model = config.model
    max_len = getattr(options, "max_model_len", None) or model.max_prompt_tokens + model.max_response_tokens
    sequences = config.explorer.max_concurrent_rollouts * config.algorithm.group_size
    per_sequence = shape.kv_bytes_per_token(dtype_bytes, tensor_parallel) * max_len
    utilization = options.gpu_memory_utilization if isinstance(options, VllmEngineOptions) else HEADROOM
    return EngineMemory(
        weights=shape.parameters * dtype_bytes / tensor_parallel,
        kv_one_sequence=per_sequence,
        kv_configured=per_sequence * sequences,
        sequences=sequences,
        budget=utilization * gpu_bytes,
    )


@dataclass(frozen=True)
class Layout:
    """A placement on one host's GPUs, or why there is none (`reason`)."""

    trainer_data_parallel: int = 0
    trainer_tensor_parallel: int = 1
    explorer_tensor_parallel: int = 0
    explorers: int = 0
    trainer_devices: tuple[int, ...] = ()
    explorer_devices: tuple[int, ...] = ()
    colocate_utilization: float | None = None  # set: the explorers share the trainer's GPUs at this utilization
    gradient_checkpointing: bool = False  # turned on for the layout to fit
    reason: str = ""


def suggest(config: RunConfig, shape: ModelShape, gpus: int, gpu_bytes: float) -> Layout:
    """The fewest GPUs the trainer fits on, the smallest explorer tensor parallelism that holds the weights and one
    sequence, and every other GPU for explorers; on a GPU too few, both on the same GPUs where they fit together.
    Where nothing fits as configured, the torch backend's gradient checkpointing is tried too."""
    layout = _place(config, shape, gpus, gpu_bytes)
    trainer = config.trainer
    if layout.reason and isinstance(trainer, TorchTrainerConfig) and not trainer.gradient_checkpointing:
        checkpointed = trainer.model_copy(update={"gradient_checkpointing": True})
        retry = _place(config.model_copy(update={"trainer": checkpointed}), shape, gpus, gpu_bytes)
        if not retry.reason:
            return replace(retry, gradient_checkpointing=True)
    return layout


def _place(config: RunConfig, shape: ModelShape, gpus: int, gpu_bytes: float) -> Layout:
    trainer = _trainer_split(config, shape, gpus, gpu_bytes)
    if trainer is None:
        return Layout(reason=f"the trainer does not fit on {gpus} GPU(s) of {gpu_bytes / GIB:.0f} GiB at any split")
    dp, tp = trainer
    ranks = dp * tp * _pipeline(config)
    engine_tp = next(
        (t for t in TP_DEGREES if t <= gpus and _divides(t, shape) and _engine_fits(config, shape, t, gpu_bytes)),
        None,
    )
    if engine_tp is None:
        return Layout(reason=f"one explorer engine does not fit on {gpus} GPU(s) of {gpu_bytes / GIB:.0f} GiB")
    trainer_devices = tuple(range(ranks))
    explorers = (gpus - ranks) // engine_tp
    if explorers:
        devices = tuple(range(ranks, ranks + explorers * engine_tp))
        return Layout(dp, tp, engine_tp, explorers, trainer_devices, devices)
    # No GPU left for an explorer: share the trainer's, with vLLM's share cut to what the trainer leaves.
    rank = trainer_rank_memory(config, shape, data_parallel=dp, tensor_parallel=tp).total
    engine = engine_memory(config, shape, tensor_parallel=engine_tp, gpu_bytes=gpu_bytes)
    left = HEADROOM * gpu_bytes - rank
    if engine_tp <= ranks and engine.weights + engine.kv_one_sequence <= left:
        utilization = int(left / gpu_bytes * 100) / 100
        return Layout(dp, tp, engine_tp, 1, trainer_devices, tuple(range(engine_tp)), utilization)
    return Layout(
        reason=f"the trainer needs {ranks} GPU(s) and an explorer engine {engine_tp} more, or room beside the "
        f"trainer ({left / GIB:.2f} GiB left there, {(engine.weights + engine.kv_one_sequence) / GIB:.2f} needed); "
        f"the machine has {gpus}"
    )


def _pipeline(config: RunConfig) -> int:
    return 1 if isinstance(config.trainer, TorchTrainerConfig) else config.trainer.pipeline_parallel_size


def _divides(tensor_parallel: int, shape: ModelShape) -> bool:
    return shape.heads % tensor_parallel == 0


def _engine_fits(config: RunConfig, shape: ModelShape, tensor_parallel: int, gpu_bytes: float) -> bool:
    return engine_memory(config, shape, tensor_parallel=tensor_parallel, gpu_bytes=gpu_bytes).fits


def _trainer_split(config: RunConfig, shape: ModelShape, gpus: int, gpu_bytes: float) -> tuple[int, int] | None:
    """(data parallel, tensor parallel) of the fewest trainer GPUs that fit: the torch backend shards over
    data-parallel ranks, Megatron splits over tensor-parallel ones (data parallel 1)."""
    pipeline = _pipeline(config)
    if isinstance(config.trainer, TorchTrainerConfig):
        candidates = [(dp, 1) for dp in range(1, gpus + 1)]
    else:
        candidates = [(1, tp) for tp in TP_DEGREES if _divides(tp, shape)]
    for dp, tp in candidates:
        if dp * tp * pipeline > gpus:
            break
        if trainer_rank_memory(config, shape, data_parallel=dp, tensor_parallel=tp).fits(gpu_bytes):
            return dp, tp
    return None


def report(config: RunConfig, gpus: int, gpu_memory_gib: float) -> tuple[list[str], bool]:
    """The lines `trinity check` prints about the layout, and whether the run fits the machine."""
    shape = ModelShape.read(config.model.path)
    gpu_bytes = gpu_memory_gib * GIB
    trainer = config.trainer
    tp = 1 if isinstance(trainer, TorchTrainerConfig) else trainer.tensor_parallel_size
    engine_tp = _configured_engine_tp(config)
    rank = trainer_rank_memory(config, shape, data_parallel=trainer.data_parallel_size, tensor_parallel=tp)
    engine = engine_memory(config, shape, tensor_parallel=engine_tp, gpu_bytes=gpu_bytes)
    lines = [
        f"layout for {gpus} GPU(s) of {gpu_memory_gib:g} GiB; model: {shape.parameters / 1e9:.3f}B parameters",
        f"trainer rank as configured (data parallel {trainer.data_parallel_size}, tensor parallel {tp}), GiB: "
        f"{rank.describe()}{'' if rank.fits(gpu_bytes) else ' (does not fit)'}",
        f"explorer engine as configured (tensor parallel {engine_tp}), GiB: {engine.describe()}"
        f"{'' if engine.fits else ' (does not fit)'}",
    ]
    layout = suggest(config, shape, gpus, gpu_bytes)
    if layout.reason:
        return [*lines, f"cannot fit: {layout.reason}"], False
    settings = [f"trainer.data_parallel_size {layout.trainer_data_parallel}"]
    if not isinstance(trainer, TorchTrainerConfig):
        settings.append(f"trainer.tensor_parallel_size {layout.trainer_tensor_parallel}")
    settings += [
        f"trainer.devices {list(layout.trainer_devices)}",
        f"explorer tensor parallel {layout.explorer_tensor_parallel}",
        f"explorer.num_workers {layout.explorers}",
        f"explorer.devices {list(layout.explorer_devices)}",
    ]
    if layout.gradient_checkpointing:
        settings.append("trainer.gradient_checkpointing true")
    if layout.colocate_utilization is not None:  # no GPU is left for an explorer of its own
        settings += ["explorer.colocate true", f"gpu_memory_utilization {layout.colocate_utilization}"]
    suggestion = "suggested: " + ", ".join(settings)
    return [*lines, suggestion], True


def _configured_engine_tp(config: RunConfig) -> int:
    options = config.explorer.engine_options
    first_class = getattr(options, "tensor_parallel_size", None)
    if first_class:
        return int(first_class)
    return int(options.extra.get("tensor_parallel_size", 1)) if isinstance(options, VllmEngineOptions) else 1
