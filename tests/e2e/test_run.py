"""`trinity run` end to end: Redis, gateway, buffer, trainer and a vLLM explorer as separate processes,
real gloo weight sync, on a tiny model (the real SmolLM2 run is the README's first command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import tiny_config, write_config


def _trinity_run(config_path: Path, output: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config_path), "--output", str(output), "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _logs(output: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((output / "logs").glob("*.log")))


@pytest.fixture(scope="module")
def sync_run(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sync-run")
    # no `repeat_times`: the grpo preset's group of 2 applies
    config = write_config(tmp / "config.yaml", tiny_config(tiny_model, **{"algorithm.repeat_times": None}))
    done = _trinity_run(config, tmp / "out")
    assert done.returncode == 0, done.stdout + done.stderr + _logs(tmp / "out")
    return json.loads((tmp / "out" / "summary.json").read_text()), tmp / "out"


def test_the_run_succeeds_and_trains_every_step(sync_run):
    summary, _ = sync_run
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    assert [row["step"] for row in summary["train"]] == [1.0, 2.0, 3.0]


def test_explorer_serves_exactly_the_weights_the_trainer_published(sync_run):
    summary, _ = sync_run
    published = {row["model_version"]: row["weights_digest"] for row in summary["train"]}
    loaded = {
        row["model_version"]: row["weights_digest"] for row in summary["weight_versions"] if "weights_digest" in row
    }
    assert sorted(loaded) == [1.0, 2.0, 3.0]  # every version reached the explorer
    for version, digest in loaded.items():
        assert digest == published[version], f"version {version}: explorer digest differs from the trainer's"
    assert len(set(published.values())) == 3  # the weights really changed each step


def test_versions_only_increase_and_rollouts_are_on_policy(sync_run):
    summary, _ = sync_run
    versions = [row["model_version"] for row in summary["weight_versions"] if "weights_digest" in row]
    assert versions == sorted(versions)
    # synchronous mode (sync_offset 0): step k trains on rollouts of version k - 1, never older
    for row in summary["train"]:
        assert row["staleness/max"] == 0.0


def test_every_experience_is_accounted_for(sync_run):
    summary, _ = sync_run
    counts = summary["experience_counts"]["stage0"]
    # 3 train steps x 2 tasks x the preset's 2 samples; each one put, delivered, acknowledged once, nothing left over
    assert counts["put"] == counts["acked"] == 12
    assert [row["samples"] for row in summary["train"]] == [4.0, 4.0, 4.0]
    assert counts["pending"] == counts["undelivered"] == counts["dead_letters"] == 0


def test_held_out_evaluations_run_at_start_interval_and_end(sync_run):
    summary, _ = sync_run
    assert [row["model_version"] for row in summary["eval"]] == [0.0, 2.0, 3.0]
    assert all(row["samples"] == 4 for row in summary["eval"])


def test_outputs_are_written(sync_run):
    _, output = sync_run
    assert (output / "reward_curve.png").stat().st_size > 1000
    assert any((output / "tensorboard").iterdir())
    assert (Path(json.loads((output / "summary.json").read_text())["final_model_path"]) / "config.json").exists()


def test_one_step_off_async_run_keeps_staleness_bounded(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{"synchronizer.sync_offset": 1, "synchronizer.max_staleness": 1, "buffer.total_steps": 4},
    )
    done = _trinity_run(write_config(tmp_path / "config.yaml", config), tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr + _logs(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["train"]) == 4
    assert max(row["staleness/max"] for row in summary["train"]) <= 1
    # one step off: the explorer ran ahead at least once (a rollout one version behind the trainer)
    assert any(row["staleness/max"] == 1 for row in summary["train"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"algorithm.algorithm_type": "grpoo"}, "algorithm.algorithm_type: unknown 'grpoo'; known: asymre"),
        ({"buffer.batch_size": "many"}, "buffer.batch_size"),
        ({"buffer.batchsize": 3}, "buffer.batchsize: unknown field"),
    ],
)
def test_a_bad_config_exits_2_naming_the_field(tiny_model, tmp_path, override, message):
    config = write_config(tmp_path / "config.yaml", tiny_config(tiny_model, **override))
    done = _trinity_run(config, tmp_path / "out", timeout=120)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()  # nothing was started
