"""The default rollout engine: vLLM's offline `LLM`, in-process (CPU build here, GPU build elsewhere)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from trinity.config.explorer import DType, VllmEngineOptions
from trinity.explorer.engines.base import (
    Engine,
    GenerationRequest,
    GenerationStream,
    Sample,
    SampleDelta,
    current_deadline,
)
from trinity.explorer.engines.registry import ENGINES
from trinity.explorer.engines.vllm_loop import EngineLoop
from trinity.explorer.engines.weights import checkpoint_tensor_names, complete_groups
from trinity.sync import SyncError, SyncGroupSpec

STAGED_RELOAD_BYTES, STREAMED_RELOAD_BYTES = 1 << 30, 64 << 20


class VllmEngineConfig(VllmEngineOptions):
    """What `VllmEngine` is built from: a run's `explorer.engine_options` plus the model and the seed.

    Here an unset `max_model_len` is the model config's own limit (a run sets it from its token
    limits). `logprobs_mode="processed_logprobs"` reports log-probs of the distribution actually
    sampled from, which is what a PPO-style trainer's `old_logprobs` must be.
    """

    model_path: str
    dtype: DType = "float32"  # fp32 log-probs match HF to 1e-4; bf16 is off by ~0.04 mean
    enforce_eager: bool = True
    seed: int = 0


def _configure_environment(config: VllmEngineConfig) -> None:
    """Env vars vLLM reads at engine start, set when an engine is made (not at import); an operator's explicit
    setting wins, except the workers' start method."""
    # In-process engine: no engine-core subprocess, and tensors pass to the worker by reference.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Workers (tensor parallel) are started from this process, which already runs gRPC and weight-sync threads: a
    # forked child inherits their locks held, and CUDA cannot be used in a child forked after it was initialized.
    # vLLM's default is fork; spawn whatever the environment says.
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    if config.tensor_parallel_size > 1:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # The CPU build binds each worker's threads to a NUMA node of its own by default and refuses more
            # workers than nodes ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"): a
            # one-node machine runs tensor parallel only unbound.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _kv_cache_size(config: VllmEngineConfig) -> dict[str, Any]:
    """The CPU build's KV cache in bytes: an `LLM` argument, not `VLLM_CPU_KVCACHE_SPACE`, whose whole GiB are too
    coarse (the quickstart needs a quarter of one, and the cache is resident). The GPU build sizes its cache from
    `gpu_memory_utilization`. An operator's `VLLM_CPU_KVCACHE_SPACE` still wins: vLLM reads it over this."""
    from vllm.platforms import current_platform

    return {"kv_cache_memory_bytes": int(config.kv_cache_space_gib * 2**30)} if current_platform.is_cpu() else {}


def _worker_ranks(config: VllmEngineConfig) -> dict[str, Any]:
    """With several workers, each is a rank of the weight-sync group: Trinity's transfer engine in every worker
    (`vllm_worker.TrinityTransferEngine`)."""
    return {"weight_transfer_config": {"backend": "trinity"}} if config.tensor_parallel_size > 1 else {}


def _block_size(config: VllmEngineConfig) -> dict[str, Any]:
    return {"block_size": config.block_size} if config.block_size else {}  # unset: vLLM's default for the platform


@ENGINES.register("vllm")
class VllmEngine(Engine):
    """vLLM `LLM` with a worker extension for in-place weight reloads, stepped by an `EngineLoop`.

    Calls from many threads join one continuously batched engine. The engine is seeded once
    (`LLM(seed=...)`): per-request seeds fail on the CPU build.
    """

    concurrent = True

    def __init__(self, config: VllmEngineConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        cfg = config or VllmEngineConfig(**kwargs)
        self.config = cfg
        _configure_environment(cfg)
        from transformers import AutoTokenizer
        from vllm import LLM

        self._tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        self._expected_names = checkpoint_tensor_names(cfg.model_path)
        build = functools.partial(
            LLM,
            model=cfg.model_path,
            dtype=cfg.dtype,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            logprobs_mode=cfg.logprobs_mode,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tensor_parallel_size=cfg.tensor_parallel_size,
            worker_extension_cls="trinity.explorer.engines.vllm_worker.TrinityWorkerExtension",
            **_worker_ranks(cfg),
            **_kv_cache_size(cfg),
            **_block_size(cfg),
            **cfg.extra,
        )
        self._loop = EngineLoop(build)
        self._llm: Any = self._loop.llm

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        # Submitted together, so one call's requests share the engine's next steps.
        streams = [self._submit(p, r, lambda: None) for p, r in zip(prompts, requests, strict=True)]
        try:
            return [_collect(deltas, r.n) for (_, deltas), r in zip(streams, requests, strict=True)]
        except BaseException:
            for request_id, _ in streams:  # one request failed (or timed out): the call's others are abandoned
                self._loop.abort(request_id)
            raise

    def _stream(
        self, prompt: list[int], request: GenerationRequest, finished: Callable[[], None]
    ) -> tuple[Iterator[SampleDelta], Callable[[], None]]:
        request_id, deltas = self._submit(prompt, request, finished)
        return deltas, lambda: self._loop.abort(request_id)

    def _submit(
        self, prompt: list[int], request: GenerationRequest, on_end: Callable[[], None]
    ) -> tuple[str, Iterator[SampleDelta]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = request.sampling
        params = SamplingParams(
            n=request.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            logprobs=0,  # 0 = only the sampled token's log-prob
            output_kind=RequestOutputKind.DELTA,  # each step's new tokens only
        )
        return self._loop.submit(
            TokensPrompt(prompt_token_ids=prompt), params, deadline=current_deadline(), on_end=on_end
        )

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Tensors are cast here so the worker's loaders copy same-dtype data (the trainer may send bf16).
        dtype = self._model_dtype()
        cast = ((n, t.detach().to(dtype)) for n, t in named_tensors)
        # Each reload call passes over the whole model (vLLM restores and re-processes every module): a staged
        # version, in memory whole already, goes in few large calls; a streamed one in calls about the sync's
        # bucket, so that the engine holds little beyond the chunk being received (docs/weight-sync.md).
        staged = isinstance(named_tensors, Sequence)
        bucket_bytes = self.config.weight_bucket_bytes or (STAGED_RELOAD_BYTES if staged else STREAMED_RELOAD_BYTES)
        for bucket in complete_groups(cast, self._expected_names, bucket_bytes):
            self._loop.call(functools.partial(self._llm.collective_rpc, "trinity_reload_weights", args=(bucket,)))
        # Cached KV blocks were computed by the old weights.
        self._loop.call(self._llm.reset_prefix_cache)

    # ---- every worker a rank of the weight-sync group (tensor parallel) ----------------------------------------

    @property
    def sync_ranks(self) -> int:
        """Ranks this engine takes in the weight-sync group: 1 (this process receives and hands the tensors to the
        worker by reference), or one per worker when the model is split across several."""
        return self.config.tensor_parallel_size

    def join_sync_group(self, spec: SyncGroupSpec, first_rank: int) -> None:
        """Every worker joins the group as ranks `first_rank`.. (blocks the engine until the group has formed);
        `SyncError` naming the workers that could not."""
        secret = spec.secret_bytes or b""
        info = {"spec_json": spec.model_dump_json(), "first_rank": first_rank, "secret_hex": secret.hex()}
        self._loop.call(functools.partial(self._llm.init_weight_transfer_engine, {"init_info": info}))
        self._worker_reports(f"joining sync group {spec.name} generation {spec.generation}")

    def _worker_reports(self, what: str) -> list[dict[str, Any]]:
        """Each worker's outcome of its last sync call (they keep it rather than raise: `TrinityTransferEngine`)."""
        reports: list[dict[str, Any]] = self._loop.call(
            functools.partial(self._llm.collective_rpc, "trinity_sync_report")
        )
        failed = [f"rank {r['rank']}: {r['error']}" for r in reports if "error" in r]
        if failed:
            raise SyncError(f"the engine's workers failed {what}: {'; '.join(failed)}")
        return reports

    def leave_sync_group(self) -> None:
        self._loop.call(self._llm.shutdown_weight_transfer_engine)

    def receive_version(self, version: int) -> tuple[int, int | None]:
        """Every worker receives `version` (announced by the trainer's doorbell) and loads its shard, calls held off
        meanwhile; returns the digest of what the workers loaded and the trainer's of what it sent. A failure part-way
        tears the engine (`torn`), as any load that fails."""

        def receive() -> tuple[int, int | None]:
            self._loop.call(self._llm.start_weight_update)
            self._loop.call(functools.partial(self._llm.update_weights, {"update_info": {"version": version}}))
            self._loop.call(self._llm.finish_weight_update)
            reports = self._worker_reports(f"weight version {version}")
            loaded = {report["loaded_digest"] for report in reports}
            if len(loaded) != 1:  # every worker received the whole version: they must agree on it
                raise RuntimeError(f"the engine's workers loaded different weights for version {version}: {reports}")
            self._loop.call(self._llm.reset_prefix_cache)
            return loaded.pop(), reports[0]["published_digest"]

        return self._load_version(version, receive)

    def _model_dtype(self) -> torch.dtype:
        return self._llm.llm_engine.model_config.dtype

    def close(self) -> None:
        # vLLM tears its process-wide distributed state down when the `LLM` is freed. That must happen here, at
        # once: an `LLM` freed later by the garbage collector tears down the state of the next run's engine.
        import gc

        loop = self.__dict__.pop("_loop", None)
        if loop is not None:
            loop.close()
        self.__dict__.pop("_llm", None)
        gc.collect()


def _collect(deltas: Iterator[SampleDelta], n: int) -> list[Sample]:
    stream = GenerationStream([], "", 0, deltas, n)
    for _ in stream:
        pass
    return stream.result().samples
