"""Run megatron-core on a machine without a GPU (gloo, fp32): the CUDA-only calls, replaced.

megatron-core is written for CUDA. With the local (non-Transformer-Engine) layer spec its model code
is device-agnostic except for a handful of places, all of which this module replaces — in the worker
processes only, and only when `torch.cuda.is_available()` is false:

* `torch.cuda.current_device()` -> the CPU device (buffers, p2p shape tensors, layers use it as a device);
* `torch.cuda.synchronize()` -> no-op (p2p communication, DDP);
* literal `device="cuda"` tensor creations (pipeline schedules' token counter, the default causal
  mask, the optimizers' loss-scale/overflow buffers, grad clipping) and `Tensor.cuda()` -> CPU, through
  a `TorchFunctionMode` that rewrites the `device` argument of factory calls;
* `Tensor.type()` -> the `torch.cuda.*Tensor` name, because the optimizers assert on it to pick the
  main-parameter path;
* the CUDA RNG tracker's state get/set and `add` -> the CPU generator (dropout is 0 in RL fine-tuning,
  but the attention and embedding code still forks the tracker).

Pinned to the megatron-core version it was tested with: a different version raises (it may need
more or fewer replacements), and `tests/megatron/test_cpu_compat.py` checks that every patched
attribute still exists. Sequence parallelism needs TE/apex kernels and is not available on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

TESTED_MEGATRON_VERSION = "0.16.1"

# (module, attribute) pairs replaced below; the test asserts each exists in the installed version.
PATCHED_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("torch.cuda", "current_device"),
    ("torch.cuda", "synchronize"),
    ("megatron.core.tensor_parallel.random", "_get_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "CudaRNGStatesTracker"),
)
# Functions that create CUDA tensors by literal; the test asserts they still do (else drop the mode).
CUDA_LITERAL_SITES: tuple[tuple[str, str], ...] = (
    ("megatron.core.transformer.utils", "get_default_causal_mask"),
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_no_pipelining"),
    ("megatron.core.optimizer.optimizer", "MixedPrecisionOptimizer"),
)

_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
}
_applied = False


def megatron_version() -> str:
    import megatron.core

    return str(megatron.core.__version__)


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int):
        return True  # a bare index means a CUDA ordinal to torch
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device arguments to CPU, `Tensor.cuda()` to a no-op, and `Tensor.type()` names."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = _CUDA_TYPE_NAMES.get(args[0].dtype)
            if name is not None:
                return name
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _CpuRNGStatesTracker:
    """`add` for the CPU generator (the CUDA version seeds `torch.cuda`); the rest is inherited."""

    @staticmethod
    def add(tracker: Any, name: str, seed: int) -> None:
        tracker._is_initialized = True
        if seed in tracker.seeds_:
            raise Exception(f"seed {seed} already exists")
        tracker.seeds_.add(seed)
        if name in tracker.states_:
            raise Exception(f"rng state {name} already exists")
        orig = torch.get_rng_state()
        torch.manual_seed(seed)
        tracker.states_[name] = torch.get_rng_state()
        torch.set_rng_state(orig)


def apply() -> None:
    """Install the replacements in this process (idempotent). Raises on an untested megatron-core."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available():
        raise RuntimeError("cpu_compat.apply() is for machines without a GPU; megatron-core runs natively on CUDA")
    version = megatron_version()
    if version != TESTED_MEGATRON_VERSION:
        raise RuntimeError(
            f"the Megatron CPU compatibility layer was tested with megatron-core=={TESTED_MEGATRON_VERSION}, "
            f"found {version}; pin megatron-core=={TESTED_MEGATRON_VERSION} or re-verify "
            "trinity/trainer/megatron/cpu_compat.py against the new version (tests/megatron/test_cpu_compat.py)"
        )
    import megatron.core.tensor_parallel.random as mrandom

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[assignment]
    mrandom.CudaRNGStatesTracker.add = _CpuRNGStatesTracker.add  # type: ignore[method-assign]
    CudaToCpuMode().__enter__()  # stays active for the life of the worker process
    _applied = True


def apply_if_no_gpu() -> bool:
    """Apply the layer when no GPU is present; returns whether it is active."""
    if torch.cuda.is_available():
        return False
    apply()
    return True
