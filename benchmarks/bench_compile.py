"""`torch.compile` of the trainer's decoder against eager: a quickstart train step, and what compiling costs.

    python -m benchmarks.bench_compile            # eager, then compiled with inductor's cache cold, then warm
    python -m benchmarks.bench_compile --quick    # fewer timed steps

Each mode runs in its own child process on 2 torch threads: `TorchBackend` on the quickstart config as it ships
(bf16 autocast, two updates per step), SmolLM2-135M-Instruct, and bench_roofline's quickstart batch (8 prompts x
8 responses of 16 tokens). `compiled` applies `torch.compile(dynamic=True)` to the decoder (`model.model`, what
the trainer's passes call; the chunked head and the loss stay eager), so every micro-batch length shares one
graph. The cold child gets an empty `TORCHINDUCTOR_CACHE_DIR`; the warm child gets the one the cold child filled,
which is what a later run on the same machine pays. Per mode: the first step (with its compilation), the steps
after it (best and median) and the first step's metrics, which must match eager's (same weights, same batch).
The summary: the steady-state speedup, the compile overhead (first compiled step minus first eager step) and
the steps a run must train before compiling has paid for itself (the overhead counts a recompilation at a later
step too: each mode's seconds beyond its median step).
Writes benchmarks/results/compile.json (`compile_quick.json` with --quick).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.bench_roofline import THREADS, quickstart_config, quickstart_stepper
from benchmarks.common import run_child, write_result

MODES = ("eager", "compiled_cold", "compiled_warm")
# First-step metrics compared against eager's: bf16 autocast and a different kernel order move them a little. Not
# the policy loss: with group-normalised advantages it sits near zero, where a relative difference means nothing.
CHECKED_METRICS = ("entropy", "grad_norm")
METRIC_TOLERANCE = 0.05


def measure(mode: str, steps: int) -> dict[str, Any]:
    """One mode in this process: the first step and `steps` more, timed around `TorchBackend.train_step`."""
    import torch

    from trinity.models import resolve_model_path
    from trinity.trainer.models import causal_lm
    from trinity.trainer.torch_backend import TorchBackend

    torch.set_num_threads(THREADS)
    config = quickstart_config(resolve_model_path("smollm2"), autocast=True)
    backend = TorchBackend(config)
    if mode != "eager":
        causal_lm(backend.policy).get_submodule("model").compile(dynamic=True)
    step = quickstart_stepper(backend, config)
    first, metrics = step()
    times = [step()[0] for _ in range(steps)]
    return {
        "mode": mode,
        "first_step_seconds": first,
        "step_seconds_all": times,
        "step_seconds_best": min(times),
        "step_seconds_median": statistics.median(times),
        "first_step_metrics": {k: float(v) for k, v in metrics.items()},
    }


def metric_differences(eager: Mapping[str, float], other: Mapping[str, float]) -> dict[str, float]:
    """Relative difference of each checked metric both steps report."""
    return {
        k: abs(other[k] - eager[k]) / max(abs(eager[k]), 1e-6) for k in CHECKED_METRICS if k in eager and k in other
    }


def excess_seconds(mode: Mapping[str, Any]) -> float:
    """Seconds a mode's steps took beyond its steady state (the median step): warm-up and every (re)compilation,
    which may come at a later step than the first (a new shape or graph)."""
    steps = [mode["first_step_seconds"], *mode["step_seconds_all"]]
    return sum(steps) - len(steps) * mode["step_seconds_median"]


def summary(modes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Speedup after compilation, what the compilation costs, and after how many steps it has paid."""
    eager = modes["eager"]
    out: dict[str, Any] = {}
    for name in MODES[1:]:
        mode = modes[name]
        saved = eager["step_seconds_median"] - mode["step_seconds_median"]
        overhead = excess_seconds(mode) - excess_seconds(eager)
        out[name] = {
            "speedup": eager["step_seconds_median"] / mode["step_seconds_median"],
            "seconds_saved_per_step": saved,
            "compile_overhead_seconds": overhead,
            "steps_to_break_even": overhead / saved if saved > 0 else None,  # None: never pays
            "first_step_metric_differences": metric_differences(
                eager["first_step_metrics"], mode["first_step_metrics"]
            ),
        }
    return out


def check_same_training(rows: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a summary whose compiled modes' first steps differ from eager's beyond `METRIC_TOLERANCE` (or share
    no checked metric with it): their times would be those of a different computation."""
    for name, row in rows.items():
        differences = row["first_step_metric_differences"]
        bad = {k: v for k, v in differences.items() if v > METRIC_TOLERANCE}
        if bad or not differences:
            raise AssertionError(f"{name} trains differently from eager (relative differences {bad or 'none'})")


def run(quick: bool = False) -> dict[str, Any]:
    steps = 3 if quick else 6
    with tempfile.TemporaryDirectory(prefix="bench-compile-inductor-") as cache:
        args = {mode: ["--child", mode, "--steps", str(steps)] for mode in MODES}
        env = {"TORCHINDUCTOR_CACHE_DIR": cache}  # the cold child fills it, the warm child reads it
        modes = {mode: run_child("benchmarks.bench_compile", args[mode], THREADS, env) for mode in MODES}
    rows = summary(modes)
    result = {"threads": THREADS, "timed_steps": steps, "modes": modes, "summary": rows}
    write_result("compile_quick" if quick else "compile", result)  # kept even when the check below fails
    check_same_training(rows)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--child", metavar="MODE", choices=MODES, help="measure one mode in this process only")
    parser.add_argument("--steps", type=int, default=6, help="with --child: steps timed after the first")
    parser.add_argument("out", nargs="?", help="with --child: the JSON file to write")
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(measure(args.child, args.steps)))
    else:
        print(json.dumps(run(args.quick)["summary"], indent=2))
