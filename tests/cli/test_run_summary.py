"""The run summary says which data operators an algorithm preset added to the run."""

from __future__ import annotations

import json
from pathlib import Path

from trinity.cli.monitor import RunMonitor, preset_additions
from trinity.config import RunConfig


def _config(preset: str, **stage: object) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"path": "unused", "max_response_tokens": 50},
            "algorithm": {"algorithm_type": preset},
            "buffer": {"taskset": {"path": "unused.jsonl"}},
            "stages": [stage] if stage else [],
        }
    )


def test_summary_lists_each_stages_preset_operators(tmp_path: Path) -> None:
    config = _config("grpo", algorithm={"algorithm_type": "dapo"})
    monitor = RunMonitor(
        tmp_path,
        total_steps=1,
        show_progress=False,
        applied_by_preset=preset_additions(config.stage_configs()),
    )
    monitor.close(None, {})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["applied_by_preset"] == [
        {
            "stage": 1,
            "algorithm": "dapo",
            "data_operators": [
                {"name": "overlong_reward_penalty", "params": {"max_response_length": 50, "cache_length": 10}},
                {"name": "reward_std_filter"},
            ],
        }
    ]


def test_a_run_whose_presets_add_nothing_says_so(tmp_path: Path) -> None:
    assert preset_additions(_config("grpo").stage_configs()) == []
