"""Launch to the first train step of the quickstart as it ships (2 steps), on a warm machine: when each service
serves, when the weight-sync group forms (the trainer has its model, the explorer its vLLM engine), the first batch
put and the first step trained, and how long each phase of the first two steps took (the first pays one-time costs
and runs beside the step-0 evaluation).

    python -m benchmarks --only startup [--quick]

Rounds one after the other (3; `--quick` 1), medians reported. Writes benchmarks/results/startup.json.
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


def run(quick: bool = False) -> dict[str, Any]:
    rounds = []
    for _ in range(1 if quick else 3):
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            ours = _run_ours(2, Path(tmp))
            timeline = Path(tmp) / "ours" / "timeline.json"
            rounds.append(
                {
                    "milestones": ours["startup_seconds"],
                    "step_1": step_phases(timeline, 1),
                    "step_2": step_phases(timeline, 2),
                }
            )
    median = {
        name: statistics.median(r["milestones"][name] for r in rounds if r["milestones"][name] is not None)
        for name in rounds[0]["milestones"]
    }
    result = {"config": "examples/quickstart/config.yaml, total_steps 2", "rounds": rounds, "median_seconds": median}
    write_result("startup_quick" if quick else "startup", result)
    return result
