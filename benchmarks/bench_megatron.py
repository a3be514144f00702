"""Megatron backend vs PyTorch backend on CPU: seconds per GRPO step and how far the results drift.

    python benchmarks/bench_megatron.py            # random Llama, hidden 256, 4 layers, vocab 4096
    python benchmarks/bench_megatron.py --quick    # the tiny test model

Same batch, same settings (KL and entropy terms, 2 mini-batches per step) for the PyTorch backend and
the Megatron backend at TP=1, TP=2, PP=2, DP=2 and DP=2 with the distributed optimizer (gloo, one thread
per worker). Each worker is one process with one thread, so DP=2 uses two cores where TP=1 uses one.
Writes benchmarks/results/megatron.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

LAYOUTS: dict[str, dict[str, Any]] = {
    "megatron_tp1": {},
    "megatron_tp2": {"tensor_parallel_size": 2},
    "megatron_pp2": {"pipeline_parallel_size": 2},
    "megatron_dp2": {"data_parallel_size": 2},
    "megatron_dp2_distributed_optimizer": {"data_parallel_size": 2, "use_distributed_optimizer": True},
}


def _batches(steps: int, n: int, vocab: int, prompt: int, resp: int) -> list[list[Any]]:
    import random

    from trinity.v1 import common_pb2

    rng = random.Random(0)
    return [
        [
            common_pb2.Experience(
                id=f"s{s}-{i}",
                kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                group_id=f"g{i // 4}",
                prompt_token_ids=[rng.randrange(3, vocab) for _ in range(prompt)],
                response_token_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(resp // 2, resp))],
                reward=float(rng.random() > 0.5),
            )
            for i in range(n)
        ]
        for s in range(steps)
    ]


def _time_steps(backend: Any, batches: list[list[Any]]) -> tuple[list[float], list[dict[str, float]]]:
    seconds, metrics = [], []
    for batch in batches:
        start = time.perf_counter()
        metrics.append(backend.train_step(batch))
        seconds.append(time.perf_counter() - start)
    return seconds, metrics


def _peak_rss_mb(pids: list[int]) -> list[float]:
    """Peak resident memory (VmHWM) of each worker process, MiB (Linux)."""
    peaks = []
    for pid in pids:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
        peaks.append(int(line.split()[1]) / 1024)
    return peaks


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    from benchmarks.common import write_result
    from trinity.config import RunConfig
    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.megatron import MegatronBackend
    from trinity.trainer.torch_backend import TorchBackend

    torch.set_num_threads(1)
    size: dict[str, Any] = (
        {"vocab_size": 272}
        if quick
        else {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 704, "num_layers": 4, "num_heads": 8}
    )
    steps, n, prompt, resp = (3, 8, 8, 16) if quick else (4, 16, 32, 64)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "model", **size)
        trainer = {"mini_batch_size": n // 2, "micro_batch_tokens": 4 * (prompt + resp), "optimizer": {"lr": 1e-4}}

        def config(**backend: Any) -> RunConfig:
            return RunConfig.model_validate(
                {
                    "mode": "train",  # with placeholder offline data: a backend reads neither
                    "seed": 0,
                    "model": {"path": str(model)},
                    "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.1, "entropy_coef": 0.01},
                    "buffer": {"offline_data": {"path": "unused.jsonl"}},
                    "trainer": {**trainer, **backend},
                }
            )

        batches = _batches(steps, n, size["vocab_size"], prompt, resp)
        ref = TorchBackend(config())
        ref_seconds, ref_metrics = _time_steps(ref, batches)
        ref_weights = dict(ref.named_weights())
        tokens = ref_metrics[-1]["tokens"]
        results: dict[str, Any] = {
            "torch": {"step_seconds_median": statistics.median(ref_seconds[1:]), "tokens_per_step": tokens}
        }
        for name, layout in LAYOUTS.items():
            start = time.perf_counter()
            backend = MegatronBackend(config(backend="megatron", **layout))
            startup = time.perf_counter() - start
            try:
                secs, metrics = _time_steps(backend, batches)
                weights = dict(backend.named_weights())
                peaks = _peak_rss_mb([p.pid for p in backend._workers._procs if p.pid is not None])
            finally:
                backend.close()
            results[name] = {
                "startup_seconds": startup,
                "step_seconds_median": statistics.median(secs[1:]),
                "peak_rss_mb_per_worker": peaks,
                "max_abs_weight_diff_vs_torch": max(
                    float((weights[k] - v).abs().max()) for k, v in ref_weights.items()
                ),
                "max_rel_loss_diff_vs_torch": max(
                    abs(m["loss/total"] - r["loss/total"]) / max(abs(r["loss/total"]), 1e-12)
                    for m, r in zip(metrics, ref_metrics, strict=True)
                ),
            }
    out = {"quick": quick, "model": size, "steps": steps, "batch": n, "results": results}
    write_result("megatron", out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(quick=parser.parse_args().quick), indent=2))
