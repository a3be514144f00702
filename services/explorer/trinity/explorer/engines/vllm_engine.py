"""The default rollout engine: vLLM's offline `LLM`, in-process (CPU build here, GPU build elsewhere)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from trinity.config.explorer import DType, VllmEngineOptions
from trinity.explorer.engines.base import Engine, GenerationRequest, Sample
from trinity.explorer.engines.registry import ENGINES
from trinity.explorer.engines.weights import checkpoint_tensor_names, complete_groups


class VllmEngineConfig(VllmEngineOptions):
    """What `VllmEngine` is built from: a run's `explorer.engine_options` plus the model and the seed.

    Here an unset `max_model_len` is the model config's own limit (a run sets it from its token
    limits). `logprobs_mode="processed_logprobs"` reports log-probs of the distribution actually
    sampled from, which is what a PPO-style trainer's `old_logprobs` must be.
    """

    model_path: str
    dtype: DType = "float32"  # fp32 log-probs match HF to 1e-4; bf16 is off by ~0.04 mean
    seed: int = 0


def _configure_environment(config: VllmEngineConfig) -> None:
    """Env vars vLLM reads at import / engine start; an operator's explicit setting wins."""
    # In-process engine: no engine-core subprocess, and tensors pass to the worker by reference.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.kv_cache_space_gib))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@ENGINES.register("vllm")
class VllmEngine(Engine):
    """vLLM `LLM` with a worker extension for in-place weight reloads.

    The engine is seeded once (`LLM(seed=...)`): per-request seeds fail on the CPU build.
    """

    def __init__(self, config: VllmEngineConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        cfg = config or VllmEngineConfig(**kwargs)
        self.config = cfg
        _configure_environment(cfg)
        from transformers import AutoTokenizer
        from vllm import LLM

        self._tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        self._expected_names = checkpoint_tensor_names(cfg.model_path)
        self._llm: Any = LLM(
            model=cfg.model_path,
            dtype=cfg.dtype,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            logprobs_mode=cfg.logprobs_mode,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            worker_extension_cls="trinity.explorer.engines.vllm_worker.TrinityWorkerExtension",
            **cfg.extra,
        )

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                n=r.n,
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                top_k=r.sampling.top_k if r.sampling.top_k > 0 else 0,
                max_tokens=r.sampling.max_tokens,
                stop=list(r.sampling.stop) or None,
                logprobs=0,  # 0 = only the sampled token's log-prob
            )
            for r in requests
        ]
        outputs = self._llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        results: list[list[Sample]] = []
        for out in outputs:
            samples = []
            for c in out.outputs:
                ids = list(c.token_ids)
                logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=True)]
                samples.append(
                    Sample(token_ids=ids, logprobs=logprobs, text=c.text, finish_reason=c.finish_reason or "")
                )
            results.append(samples)
        return results

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Tensors are cast here so the worker's loaders copy same-dtype data (the trainer may send bf16).
        dtype = self._model_dtype()
        cast = ((n, t.detach().to(dtype)) for n, t in named_tensors)
        for bucket in complete_groups(cast, self._expected_names, self.config.weight_bucket_bytes):
            self._llm.collective_rpc("trinity_reload_weights", args=(bucket,))
        # Cached KV blocks were computed by the old weights.
        self._llm.reset_prefix_cache()

    def _model_dtype(self) -> torch.dtype:
        return self._llm.llm_engine.model_config.dtype

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            del self._llm
            import gc

            gc.collect()
