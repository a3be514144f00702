"""The memory floor under ours' stack: what the trainer and the explorer hold before the first batch.

    python -m benchmarks.bench_memory_floor

Each part runs in its own child process (a fresh RSS), SmolLM2-135M-Instruct, the quickstart config:
- `trainer`: the imports, the fp32 model, its gradients and one fused AdamW step (two fp32 moments): the state any
  fp32-AdamW trainer holds (TRL's too), with no activations, no gRPC and no service around it. Its floor is the
  imports' RSS plus 16 bytes per parameter (the RSS after one step is reported too: it can miss pages that later
  steps write);
- `explorer`: the imports, then the run's engine (`build_engine`: vLLM, bf16 weights, the quickstart's KV cache),
  before any request and before a staged copy of the next weights.
The floor is their sum plus the rest of the stack (gateway, buffer, CLI, Redis) at the peak of the last e2e run
(`benchmarks/results/e2e.json`), compared with that run's whole-stack peak and with its memory goal: at most half
the peak of the fastest TRL configuration to 0.90 held-out accuracy.
Writes benchmarks/results/memory_floor.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.bench_roofline import THREADS, quickstart_config
from benchmarks.common import RESULTS, run_child, write_result

PARTS = ("trainer", "explorer")
MB = 2**20
TRAIN_STATE_BYTES_PER_PARAMETER = 16  # fp32 weight, its gradient and AdamW's two fp32 moments
SERVICES = ("trinity.runtime.serve trainer", "trinity.runtime.serve explorer")


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / MB


def _trainer() -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from trinity.models import resolve_model_path

    torch.set_num_threads(THREADS)
    phases = {"imports": _rss_mb()}
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2"), dtype=torch.float32)
    phases["fp32 weights"] = _rss_mb()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    phases["+ gradients"] = _rss_mb()
    torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True).step()
    phases["+ AdamW moments"] = _rss_mb()
    phases["parameters"] = float(sum(p.numel() for p in model.parameters()))
    return phases


def _explorer() -> dict[str, float]:
    from trinity.explorer.runner import build_engine
    from trinity.models import resolve_model_path

    phases = {"imports": _rss_mb()}
    model_path = resolve_model_path("smollm2")
    engine = build_engine(quickstart_config(model_path, autocast=True), model_path)
    phases["engine built"] = _rss_mb()
    engine.close()
    return phases


def floor(parts: Mapping[str, Mapping[str, float]], e2e: Mapping[str, Any] | None) -> dict[str, Any]:
    """The stack's floor from the parts' last phases, against the e2e run's peak and memory goal."""
    trainer = parts["trainer"]
    out: dict[str, Any] = {
        # The bytes the training state must hold once every step has written it, on top of the imports: an RSS
        # reading right after one step can miss pages not yet written (mmapped weights, untouched zero pages).
        "trainer_mb": trainer["imports"] + trainer["parameters"] * TRAIN_STATE_BYTES_PER_PARAMETER / MB,
        "explorer_mb": parts["explorer"]["engine built"],
    }
    if e2e is None:
        return out
    at_peak = e2e["ours"]["memory"]["at_peak_mb"]
    out["rest_of_stack_mb"] = sum(v for role, v in at_peak.items() if role not in SERVICES)
    out["floor_mb"] = out["trainer_mb"] + out["explorer_mb"] + out["rest_of_stack_mb"]
    fastest = e2e["comparison"]["trl_configuration"] if e2e.get("comparison") else None
    trl = {row["config"]: row for row in e2e["table"]}.get(fastest)
    out["e2e_when"] = e2e["when"]
    out["ours_peak_mb"] = e2e["ours"]["peak_rss_mb"]
    if trl is not None:
        out["fastest_trl"] = fastest
        out["goal_mb"] = trl["peak_rss_mb"] / 2
        out["floor_over_goal"] = out["floor_mb"] / out["goal_mb"]
    return out


def run(quick: bool = False) -> dict[str, Any]:
    del quick  # two model loads: nothing to shorten
    parts = {part: run_child("benchmarks.bench_memory_floor", ["--child", part], THREADS) for part in PARTS}
    e2e_path = RESULTS / "e2e.json"
    e2e = json.loads(e2e_path.read_text()) if e2e_path.exists() else None
    result = {"parts": parts, "summary": floor(parts, e2e)}
    write_result("memory_floor", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)  # one measuring process
    parser.add_argument("out", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measured = _trainer() if args.child == "trainer" else _explorer()
        Path(args.out).write_text(json.dumps(measured))
    else:
        print(json.dumps(run()["summary"], indent=2))
