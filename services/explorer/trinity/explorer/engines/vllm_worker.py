"""Methods added to vLLM's worker (`worker_extension_cls`), and Trinity's weight-transfer engine for vLLM's
workers; imported by qualified name inside vLLM, in every worker process.

Kept free of other Trinity imports at module level so a vLLM worker process can import it cheaply.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

NamedTensors = list[tuple[str, torch.Tensor]]

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
    weight_transfer_engine: Any

    def trinity_reload_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load checkpoint-format (Hugging Face named) tensors in place; returns how many were given.

        `model.load_weights` is not usable on CPU (weights are repacked for oneDNN after loading);
        `reload_weights` restores the checkpoint layout, loads, and re-runs the repacking.
        """
        named = list(named_tensors)
        # Through the worker, which sets the current vLLM config the loaders read.
        reload_in_place(lambda group: self.reload_weights(weights_iterator=group, is_checkpoint_format=True), named)
        model = self.model_runner.get_model()
        _repack_tied_modules(model)
        _repack_reloaded_cpu_experts(model, [name for name, _ in named])
        return len(named)

    def trinity_sync_report(self) -> dict[str, Any]:
        """What this worker's rank of the sync group did with the last version (`TrinityTransferEngine.report`)."""
        engine = self.weight_transfer_engine
        if not isinstance(engine, TrinityTransferEngine):
            raise RuntimeError("the engine was not started with weight_transfer_config backend 'trinity'")
        return dict(engine.report)


def reload_in_place(reload: Callable[[Iterator[tuple[str, torch.Tensor]]], Any], named: NamedTensors) -> None:
    """`reload(iterator)` of one group of whole layers, with vLLM's per-untouched-module warnings quieted."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in _NOISY_LOGGERS]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        reload(iter(named))
    finally:
        for logger, level in saved:
            logger.setLevel(level)


@dataclass
class TrinityInitInfo(WeightTransferInitInfo):
    """`init_weight_transfer_engine`'s: the run's sync group (its spec as JSON), this engine's first rank in it, and
    the generation's secret (hex; empty without one), which a JSON spec never carries."""

    spec_json: str
    first_rank: int
    secret_hex: str = ""


@dataclass
class TrinityUpdateInfo(WeightTransferUpdateInfo):
    """`update_weights`': the version the trainer's doorbell announced."""

    version: int


class TrinityTransferEngine(WeightTransferEngine[TrinityInitInfo, TrinityUpdateInfo]):
    """Every vLLM worker a rank of the run's weight-sync group (`weight_transfer_config={"backend": "trinity"}`).

    Each worker receives every version itself, verified a chunk at a time (`WeightReceiver.receive_streamed`:
    nothing unverified is loaded), and loads its own shard of each group of whole decoder layers (vLLM's weight
    loaders cut a worker's slice out of a full checkpoint tensor), so no tensor crosses vLLM's worker message queue
    and no worker holds more than a chunk and a reload group beside its shard. The transport is Trinity's (gloo on
    CPU, NCCL on GPUs, checksummed and, with a secret, authenticated), registered through vLLM's own weight-transfer
    factory so that vLLM's `init_weight_transfer_engine` / `start_weight_update` / `update_weights` /
    `finish_weight_update` drive it. Reloads go a group of whole layers per call, as `trinity_reload_weights` does:
    a failure between two calls leaves every module whole (old or new), never half-processed.
    """

    init_info_cls = TrinityInitInfo
    update_info_cls = TrinityUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        from trinity.runtime.logging import configure_logging

        super().__init__(config, vllm_config, device, model)
        configure_logging("explorer")  # a spawned worker: its sync events go to the explorer's stream as JSON too
        from trinity.explorer.engines.weights import checkpoint_tensor_names

        self.receiver: Any = None
        self.report: dict[str, Any] = {}
        # What a whole layer is, read once from the checkpoint's headers (every version has the same names).
        self.expected_names = checkpoint_tensor_names(self.model_config.model)

    # vLLM's multiprocess executor raises at the first worker whose call failed and leaves the other workers' replies
    # queued, where the next call reads them as its own (vllm/v1/executor/multiproc_executor.py, collective_rpc): a
    # failed update would answer every later call with a stale error. So these calls never raise; each worker keeps
    # its outcome in `report`, which the explorer reads from every worker (`trinity_sync_report`) and raises from.

    def init_transfer_engine(self, init_info: TrinityInitInfo) -> None:
        self._reporting(lambda: self._join(init_info))

    def receive_weights(self, update_info: TrinityUpdateInfo) -> None:
        self._reporting(lambda: self._receive(update_info))

    def _reporting(self, step: Callable[[], dict[str, Any]]) -> None:
        try:
            self.report = step()
        except Exception as err:  # noqa: BLE001 - handed to the explorer through `report` (see above)
            self.report = {"error": f"{type(err).__name__}: {err}"}
        self.report["rank"] = self.receiver.rank if self.receiver is not None else None

    def _join(self, init_info: TrinityInitInfo) -> dict[str, Any]:
        from trinity.sync import SyncGroupSpec, open_receiver

        self.shutdown()
        fields = json.loads(init_info.spec_json)
        spec = SyncGroupSpec.model_validate({**fields, "secret": bytes.fromhex(init_info.secret_hex) or None})
        # The worker's rank among this engine's workers (tensor x pipeline parallel) after the engine's first rank.
        rank = init_info.first_rank + self.parallel_config.rank
        device = self.device if spec.backend == "nccl" else None
        self.receiver = open_receiver(spec, rank, **({"device": device} if device is not None else {}))
        self.receiver.init()
        return {}

    def start_weight_update(self) -> None:
        """Nothing: each group of whole layers is a reload call of its own (`receive_weights`)."""

    def _receive(self, update_info: TrinityUpdateInfo) -> dict[str, Any]:
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        from trinity.explorer.engines.vllm_engine import STREAMED_RELOAD_BYTES
        from trinity.explorer.engines.weights import complete_groups
        from trinity.sync import load_streamed

        if self.receiver is None:
            raise RuntimeError("update_weights before init_weight_transfer_engine")
        names: list[str] = []
        dtype = self.model_config.dtype

        def load(version: int, named: Iterator[tuple[str, torch.Tensor]]) -> None:
            if version != update_info.version:
                raise RuntimeError(f"the trainer sent version {version}, version {update_info.version} was announced")
            cast = ((n, t.to(dtype)) for n, t in named)
            for group in complete_groups(cast, self.expected_names, STREAMED_RELOAD_BYTES):
                reload_in_place(lambda it: reload_weights(self.vllm_config, self.model, it, None, True), group)
                names.extend(name for name, _ in group)

        version, named = self.receiver.receive_streamed()
        loaded = load_streamed(version, named, load)
        _repack_tied_modules(self.model)
        _repack_reloaded_cpu_experts(self.model, names)
        return {"version": version, "loaded_digest": loaded, "published_digest": self.receiver.published_digest}

    def finish_weight_update(self) -> None:
        """Nothing left: `receive_weights` loaded and processed every group."""

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None


# Registered where vLLM imports this module: in every worker process (to resolve `worker_extension_cls`), before the
# worker builds its weight-transfer engine.
if "trinity" not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine("trinity", TrinityTransferEngine)


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
