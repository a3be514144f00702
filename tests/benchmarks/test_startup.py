"""benchmarks/bench_startup.py's pure parts: the trainer phases read from a run's timeline, the rounds' medians."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_startup import medians, step_phases


def test_step_phases_are_the_trainers_spans_of_that_step(tmp_path: Path) -> None:
    spans = [
        {"source": "trainer/t-1", "phase": "forward_backward", "step": 1, "start_unix_ms": 1000, "end_unix_ms": 6500},
        {"source": "trainer/t-1", "phase": "optimizer", "step": 1, "start_unix_ms": 6500, "end_unix_ms": 6900},
        {"source": "trainer/t-1", "phase": "optimizer", "step": 2, "start_unix_ms": 9000, "end_unix_ms": 9300},
        {"source": "explorer/e-1", "phase": "rollout", "step": 1, "start_unix_ms": 0, "end_unix_ms": 3000},
        {"source": "trainer/t-1", "phase": "checkpoint", "step": 1, "start_unix_ms": 7000, "end_unix_ms": 8000},
    ]
    timeline = tmp_path / "timeline.json"
    timeline.write_text(json.dumps({"spans": spans}))
    assert step_phases(timeline, 1) == {"forward_backward": 5.5, "optimizer": 0.4}


def test_medians_skip_a_round_that_never_reached_a_milestone() -> None:
    rounds = [
        {"milestones": {"sync_group_ready": 11.0, "first_step_trained": 22.0}},
        {"milestones": {"sync_group_ready": 13.0, "first_step_trained": None}},
        {"milestones": {"sync_group_ready": 12.0, "first_step_trained": 24.0}},
    ]
    assert medians(rounds) == {"sync_group_ready": 12.0, "first_step_trained": 23.0}
