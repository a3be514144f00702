"""One GRPO train step on 1 rank against the same step on 2 FSDP2 ranks (gloo), same batch, same cores.

    python benchmarks/bench_data_parallel.py            # SmolLM2-135M (converted from the shipped GGUF once)
    python benchmarks/bench_data_parallel.py --quick    # tiny random model, seconds

The single rank gets every core as torch threads; each of the N ranks gets cores / N. Reported per layout:
median seconds per step (after one warm-up step) and each rank's peak RSS. Writes
benchmarks/results/data_parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the ranks run this file as a script
from benchmarks.bench_trainer import _experiences, _peak_rss_mb
from benchmarks.common import write_result


def _rank(rank: int, world: int, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from trinity.config import RunConfig
    from trinity.trainer.torch_backend import TorchBackend

    torch.set_num_threads(spec["threads"])
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(minutes=10)
        )
    config = RunConfig.model_validate(
        {
            "mode": "train",
            "model": {"path": spec["model"]},
            "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.0},
            "buffer": {"total_steps": 100, "offline_data": {"path": "unused.jsonl"}},
            "trainer": {"data_parallel_size": world, "micro_batch_tokens": spec["micro_batch_tokens"]},
        }
    )
    backend = TorchBackend(config)
    exps = _experiences(**spec["shape"], vocab=int(spec["vocab"]))
    seconds = []
    for step in range(spec["steps"] + 1):
        for e in exps:
            e.id = f"{e.id.split('@')[0]}@{step}"  # a new step trains the batch again under new ids
        started = time.perf_counter()
        backend.train_step(exps)
        seconds.append(time.perf_counter() - started)
    if world > 1:
        dist.destroy_process_group()
    return {"step_seconds": statistics.median(seconds[1:]), "peak_rss_mb": _peak_rss_mb()}


def _layout(world: int, spec: dict[str, Any]) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cores = os.cpu_count() or 1
    rank_spec = {**spec, "threads": max(1, cores // world)}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), str(world), str(port), json.dumps(rank_spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for r in range(world)
    ]
    ranks = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a rank of the {world}-rank layout exited with {p.returncode}")
        ranks.append(json.loads(out.decode().strip().splitlines()[-1]))
    return {
        "ranks": world,
        "threads_per_rank": rank_spec["threads"],
        "step_seconds": max(r["step_seconds"] for r in ranks),
        "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in ranks],
    }


def run(quick: bool = False) -> dict[str, Any]:
    from trinity.models.gguf import ensure_smollm2
    from trinity.models.tiny import build_tiny_llama

    tmp = tempfile.mkdtemp(prefix="bench-dp-")
    if quick:
        model = build_tiny_llama(Path(tmp) / "tiny", vocab_size=512, hidden_size=128, num_layers=4)
        spec = {"shape": {"n_prompts": 4, "group": 4, "prompt_len": 32, "resp_len": 64}, "vocab": 512, "steps": 2}
    else:
        cache = Path(os.environ.get("TRINITY_MODEL_CACHE", Path.home() / ".cache" / "trinity" / "models"))
        model = ensure_smollm2(cache)
        spec = {"shape": {"n_prompts": 8, "group": 4, "prompt_len": 48, "resp_len": 96}, "vocab": 49152, "steps": 2}
    spec.update({"model": str(model), "micro_batch_tokens": 4096})
    one, two = _layout(1, spec), _layout(2, spec)  # one after the other: they share the cores
    result = {
        "model": "tiny" if quick else "SmolLM2-135M",
        "batch": spec["shape"],
        "layouts": [one, two],
        "dp2_over_dp1_step_time": round(two["step_seconds"] / one["step_seconds"], 3),
        "dp2_over_dp1_peak_rss_per_rank": round(max(two["peak_rss_mb_per_rank"]) / one["peak_rss_mb_per_rank"][0], 3),
    }
    write_result("data_parallel", result)
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        print(json.dumps(_rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]))))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=2))


if __name__ == "__main__":
    main()
