"""examples/textworld and examples/scienceworld as two-step `trinity run`s on a tiny model (every service a process),
on the real engines: TextWorld games generated and compiled inside the run, ScienceWorld's JVM per episode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_modes import _run, example_config

pytestmark = pytest.mark.system


def _small(name: str, model: Path, **changes) -> dict:
    config = example_config(
        name,
        model,
        **{
            "model.max_prompt_tokens": 3072,
            "model.max_response_tokens": 8,
            "buffer.batch_size": 2,
            "buffer.train_batch_size": 8,
            "explorer.eval_interval": 2,
            **changes,
        },
    )
    config["buffer"]["eval_tasksets"][0]["limit"] = 2
    return config


def _check(summary: dict) -> None:
    assert summary["state"] == "RUN_STATE_SUCCEEDED", summary.get("error")
    assert [row["step"] for row in summary["train"]] == [1, 2]
    counts = summary["experience_counts"]["stage0"]
    assert counts["pending"] == 0 and counts["acked"] >= 16  # two steps of 8 step experiences
    assert [row["model_version"] for row in summary["eval"]] == [0, 2], summary["eval"]


def test_the_textworld_example_trains_two_steps_on_generated_games(long_context_tiny_model, tmp_path):
    games = tmp_path / "games"
    config = _small(
        "textworld", long_context_tiny_model, **{"explorer.workflow_options": {"max_steps": 2, "games_dir": str(games)}}
    )
    _check(_run(config, tmp_path))
    assert list(games.glob("*.z8")), "the run compiled no game"


def test_the_scienceworld_example_trains_two_steps(long_context_tiny_model, tmp_path):
    config = _small(
        "scienceworld",
        long_context_tiny_model,
        **{"explorer.workflow_options": {"max_steps": 2, "max_listed_actions": 10}},
    )
    _check(_run(config, tmp_path))
