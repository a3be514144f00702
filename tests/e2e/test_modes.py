"""The example configs as end-to-end runs on a tiny model: offline SFT and DPO (mode `train`),
multi-step FrozenLake with GiGPO, and a two-stage SFT-then-GRPO run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.e2e.conftest import write_config
from tests.e2e.test_run import _logs, _trinity_run
from trinity.config import load_run_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_config(name: str, model: Path, steps: int = 2, **changes) -> dict:
    """The example's config (paths resolved as the file would), on the tiny model, with few steps."""
    config = json.loads(load_run_config(EXAMPLES / name / "config.yaml").model_dump_json())
    config["model"]["path"] = str(model)
    config["buffer"]["total_steps"] = steps
    for stage in config["stages"]:
        stage.setdefault("buffer", {})["total_steps"] = steps
    for dotted, value in changes.items():
        node = config
        *path, last = dotted.split(".")
        for key in path:
            node = node[key]
        node[last] = value
    return config


def _run(config: dict, tmp_path: Path) -> dict:
    output = tmp_path / "out"
    done = _trinity_run(write_config(tmp_path / "config.yaml", config), output)
    assert done.returncode == 0, done.stdout + done.stderr + _logs(output)
    return json.loads((output / "summary.json").read_text())


def test_offline_sft_trains_on_the_loaded_chats(tiny_model, tmp_path):
    summary = _run(example_config("sft", tiny_model), tmp_path)
    assert [row["samples"] for row in summary["train"]] == [16.0, 16.0]
    counts = summary["experience_counts"]["stage0"]
    assert counts["put"] == 100 and counts["acked"] == 32  # 100 demonstrations loaded, 2 x 16 trained


def test_offline_dpo_starts_at_log_two_and_trains_pairs(tiny_model, tmp_path):
    summary = _run(example_config("dpo", tiny_model), tmp_path)
    # policy == reference at the first step: the DPO loss is exactly -log(sigmoid(0)) = log 2
    assert summary["train"][0]["loss/total"] == pytest.approx(math.log(2), abs=1e-4)
    assert summary["experience_counts"]["stage0"]["acked"] == 32


def test_multi_step_frozen_lake_with_gigpo(tiny_model, tmp_path):
    config = example_config(
        "frozenlake",
        tiny_model,
        **{
            "explorer.workflow_options": {"max_steps": 2},
            "model.max_response_tokens": 8,
            "algorithm.repeat_times": 4,
            "buffer.train_batch_size": 16,
        },
    )
    summary = _run(config, tmp_path)
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    assert len(summary["train"]) == 2
    counts = summary["experience_counts"]["stage0"]
    assert counts["pending"] == 0 and counts["acked"] >= 32  # step experiences: several per episode


def test_sft_then_grpo_starts_stage_two_from_the_sft_weights(tiny_model, tmp_path):
    summary = _run(example_config("multistage", tiny_model), tmp_path)
    assert [(row["stage"], row["step"]) for row in summary["train"]] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert set(summary["experience_counts"]) == {"stage0", "stage1"}
    assert summary["final_model_path"].endswith("stage1/final")
    (stage_two,) = [s["message"] for s in summary["states"] if s["message"].startswith("stage 1 starting")]
    assert stage_two.endswith("stage0/final")  # the gateway hands stage 2 the model stage 1 exported


def test_trinity_bench_evaluates_a_model_and_writes_a_report(tiny_model, tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "bench", "--config", str(EXAMPLES / "quickstart" / "config.yaml"),
         "--model", str(tiny_model), "--output", str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + _logs(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["train"] == [] and len(summary["eval"]) == 1  # evaluation only, of version 0
    report = json.loads((tmp_path / "out" / "checkpoints" / "bench_report.json").read_text())
    assert report["overall"]["samples"] == 20 * 8  # 20 held-out tasks x eval_repeat_times
    assert 0.0 <= report["overall"]["accuracy"] <= 1.0
