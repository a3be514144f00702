"""Methods added to vLLM's worker (`worker_extension_cls`); imported by qualified name inside vLLM.

Kept free of other Trinity imports so a vLLM worker process can import it cheaply.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import torch

# The in-place reload warns for every module a call does not touch ("Failed to load weights",
# "weights were not loaded"); with per-layer calls that is expected, so those loggers are quieted.
_NOISY_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


class TrinityWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `model_runner`)."""

    reload_weights: Any
    model_runner: Any

    def trinity_reload_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load checkpoint-format (Hugging Face named) tensors in place; returns how many were given.

        `model.load_weights` is not usable on CPU (weights are repacked for oneDNN after loading);
        `reload_weights` restores the checkpoint layout, loads, and re-runs the repacking.
        """
        named = list(named_tensors)
        saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in _NOISY_LOGGERS]
        for logger, _ in saved:
            logger.setLevel(logging.ERROR)
        try:
            # Through the worker, which sets the current vLLM config the loaders read.
            self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        finally:
            for logger, level in saved:
                logger.setLevel(level)
        model = self.model_runner.get_model()
        _repack_tied_modules(model)
        _repack_reloaded_cpu_experts(model, [name for name, _ in named])
        return len(named)


def _repack_tied_modules(model: torch.nn.Module) -> None:
    """Re-run weight post-processing for modules that share a weight (a tied `lm_head`).

    On CPU each linear keeps a packed copy of its weight (`cpu_linear`, built after loading). The
    reload re-packs only modules it loaded, and a tied `lm_head` loads nothing itself (its tensor
    arrives as `embed_tokens`), so it would keep projecting with the old embedding: measured, the
    greedy output after a reload then differs from a fresh engine on the new weights.
    """
    by_storage: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel() > 0:
            by_storage.setdefault(weight.data_ptr(), []).append(module)
    for modules in by_storage.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def _repack_reloaded_cpu_experts(model: torch.nn.Module, names: list[str]) -> None:
    """Re-run the CPU expert kernel's prepacking on the MoE layers a reload wrote (`names`: their tensors).

    The reload restores the experts' checkpoint layout and loads into it, but vLLM's weight-update path
    (`UnquantizedFusedMoEMethod._setup_kernel` once a kernel is built) skips the kernel's own
    `process_weights_after_loading`, where the CPU kernel prepacks into its grouped-GEMM layout; the kernel then
    reads checkpoint-layout weights as packed ones (measured on the tiny Qwen3-MoE of tests/models: reloading the
    very weights it serves moved greedy log-probs by 0.11). Only the layers of this call: the others are packed
    already, and packing twice is as wrong. GPU kernels keep their layout through `_setup_kernel` and are left alone.
    """
    layers = {match.group(1) for name in names if (match := _LAYER.match(name))}
    for name, module in model.named_modules():
        experts = getattr(getattr(getattr(module, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        weight = getattr(module, "w13_weight", None)
        if experts is None or not isinstance(weight, torch.Tensor) or weight.device.type != "cpu":
            continue
        match = _LAYER.match(name + ".")
        if match and match.group(1) in layers:
            experts.process_weights_after_loading(module)
