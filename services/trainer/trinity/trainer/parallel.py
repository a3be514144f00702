"""Data parallelism of the PyTorch backend: where a rank's tensors live, its share of a batch, FSDP2 sharding.

Every rank receives the whole train batch and computes what needs the whole batch itself (group-normalised
advantages need every member of a group; recomputing them is cheaper than sending them). Each mini-batch's
samples are then dealt to the ranks, longest first to the least-loaded rank, keeping samples of one prompt
together when there are at least as many prompts as ranks (so a shared prompt is still computed once). Every
rank plans its own token-budget micro-batches; the loss of each micro-batch is already scaled by its share of
the whole mini-batch (`objectives.share`), so the sum of the ranks' gradients is the single-process gradient:
FSDP2 reduce-scatters a sum, not a mean. A rank with fewer micro-batches than another runs zero-weight passes,
because every FSDP2 forward and backward is a collective all ranks must enter.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trinity.config import TorchTrainerConfig
from trinity.trainer.batch import Sample, plan_micro_batches
from trinity.trainer.models import DTYPES


@dataclass(frozen=True)
class Ranks:
    """This process's place in the trainer's default process group (rank 0 of 1 without one)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def sharded(self) -> bool:
        return self.world > 1

    def check(self, trainer: TorchTrainerConfig) -> None:
        if self.world != trainer.data_parallel_size:
            raise ValueError(
                f"trainer.data_parallel_size is {trainer.data_parallel_size} but this rank's process group has "
                f"{self.world} rank(s): the ranks runtime starts one process per rank"
            )


def resolve_device(spec: str, local_rank: int | None = None) -> torch.device:
    """`trainer.device` for this rank: `auto` is the rank's GPU (LOCAL_RANK) when there is one, else the CPU."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if spec == "auto":
        return torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not cuda:
        raise ValueError(f"trainer.device is {spec!r} but this torch sees no CUDA device (a CPU build, or no GPU)")
    device = torch.device(spec) if ":" in spec else torch.device("cuda", local_rank)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"trainer.device is {spec!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return device


@dataclass(frozen=True)
class Precision:
    """What the weights are stored in, and what the matmuls run in.

    `load`: dtype of the parameters the optimizer updates; `compute`: dtype FSDP2 all-gathers them in
    (None = as stored); `autocast`: bf16 autocast around the forward passes.
    """

    load: torch.dtype
    compute: torch.dtype | None = None
    autocast: bool = False


def resolve_precision(trainer: TorchTrainerConfig, model_dtype: str, device: torch.device, sharded: bool) -> Precision:
    """bf16 weights on a GPU unless told otherwise, updated through fp32 master weights unless told otherwise: the
    optimizer keeps fp32 and the compute is bf16 (FSDP2's mixed precision when sharded, autocast on one rank).
    Without master weights an lr-1e-6 update is below bf16's rounding step for almost every weight. A CPU keeps
    `model_dtype` and no master copy."""
    weights: str = trainer.weights_dtype
    if weights == "auto":
        weights = "bfloat16" if device.type == "cuda" else model_dtype
    master = trainer.fp32_master_weights
    if master and weights != "bfloat16":
        raise ValueError("trainer.fp32_master_weights needs bfloat16 weights (trainer.weights_dtype)")
    if master is None:
        master = weights == "bfloat16" and device.type == "cuda"
    if master:
        if sharded:
            return Precision(torch.float32, compute=torch.bfloat16)
        return Precision(torch.float32, autocast=True)
    return Precision(DTYPES[weights], autocast=trainer.autocast == "bfloat16")


# ------------------------------------------------------------------------------------------------ the batch split


def deal(samples: Sequence[Sample], world: int, share_prompts: bool) -> list[list[int]]:
    """Sample indices of each rank: longest-first onto the least-loaded rank, one prompt's samples together
    when there are at least `world` prompts. Deterministic, so every rank computes every rank's share."""
    units: list[list[int]]
    if share_prompts:
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(samples):
            by_prompt.setdefault(tuple(s.chosen.prompt), []).append(i)
        units = list(by_prompt.values())
    else:
        units = []
    if len(units) < world:
        units = [[i] for i in range(len(samples))]

    def cost(unit: list[int]) -> int:
        return sum(samples[i].cost_length * len(samples[i].sequences) for i in unit)

    shares: list[list[int]] = [[] for _ in range(world)]
    loads = [0] * world
    for unit in sorted(units, key=cost, reverse=True):
        r = min(range(world), key=lambda k: (loads[k], k))
        shares[r].extend(unit)
        loads[r] += cost(unit)
    return [sorted(s) for s in shares]


def rank_micro_batches(
    samples: Sequence[Sample], ranks: Ranks, token_budget: int, share_prompts: bool
) -> list[list[int] | None]:
    """This rank's micro-batches (indices into `samples`), padded with None (a zero-weight pass) to the
    count of the busiest rank."""
    if not ranks.sharded:
        return list(plan_micro_batches(samples, token_budget, share_prompts))
    plans = []
    for share in deal(samples, ranks.world, share_prompts):
        local = plan_micro_batches([samples[i] for i in share], token_budget, share_prompts)
        plans.append([[share[j] for j in mb] for mb in local])
    longest = max(len(p) for p in plans)
    mine: list[list[int] | None] = list(plans[ranks.rank])
    return mine + [None] * (longest - len(mine))


def sum_across(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """In place: the sum over ranks (exact for the disjoint, zero-filled row blocks `forward_rows` gathers)."""
    if ranks.sharded:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def merge_weighted(sums: dict[str, float], weights: dict[str, float], ranks: Ranks) -> dict[str, float]:
    """Weighted means of the ranks' metrics, as one process over the whole batch would report them; a metric
    named `..._max` holds a maximum (weight 1) and is the largest of the ranks'."""
    if ranks.sharded:
        gathered: list[Any] = [None] * ranks.world
        dist.all_gather_object(gathered, (sums, weights))
        sums, weights = {}, {}
        for s, w in gathered:
            for k, v in s.items():
                if k.endswith("_max"):
                    sums[k], weights[k] = max(sums.get(k, v), v), 1.0
                    continue
                sums[k] = sums.get(k, 0.0) + v
                weights[k] = weights.get(k, 0.0) + w[k]
    return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}


def scalar(value: torch.Tensor) -> float:
    """A float of a tensor that may be a DTensor (a sharded gradient norm)."""
    full = getattr(value, "full_tensor", None)
    return float(full() if full is not None else value)


# ------------------------------------------------------------------------------------------------ FSDP2


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a Hugging Face model (each becomes one FSDP2 unit)."""
    layers = [m for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and name.endswith("layers")]
    if len(layers) != 1:
        raise ValueError(f"expected one `layers` ModuleList in {type(model).__name__}, found {len(layers)}")
    return list(layers[0])


def shard(root: nn.Module, blocks: Sequence[nn.Module], precision: Precision, device: torch.device) -> nn.Module:
    """FSDP2 over the ranks: one unit per block, the rest (embeddings, final norm, heads) in the root's unit.
    Gradients are reduce-scattered as sums (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy)
    for module in [*blocks, root]:
        assert isinstance(module, FSDPModule)
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return root


@contextmanager
def unsharded(module: nn.Module) -> Iterator[None]:
    """The module's own parameters gathered (plain tensors) for the duration; a no-op when not sharded."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()
