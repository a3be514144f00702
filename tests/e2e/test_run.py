"""`trinity run` end to end: Redis, gateway, buffer, trainer and a vLLM explorer as separate processes,
real gloo weight sync, on a tiny model (the real SmolLM2 run is the README's first command)."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
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


def succeeded_summary(config: dict, tmp_path: Path) -> dict:
    """`trinity run` of `config` under `tmp_path`, which must exit 0 and SUCCEED; its summary."""
    output = tmp_path / "out"
    done = _trinity_run(write_config(tmp_path / "config.yaml", config), output)
    assert done.returncode == 0, done.stdout + done.stderr + _logs(output)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    return summary


@pytest.fixture(scope="module")
def sync_run(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sync-run")
    # no `repeat_times`: the grpo preset's group of 2 applies
    # limits the fp32 run stays well within: a warning would be a real train-vs-rollout mismatch
    limits = {"max_logprob_diff_mean": 0.01, "max_k3_kl": 1e-3, "max_ratio_outside_share": 0.01}
    overrides = {"algorithm.repeat_times": None, "monitor.consistency": limits}
    config = write_config(tmp / "config.yaml", tiny_config(tiny_model, **overrides))
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


def test_the_trainer_reads_the_samplers_logprobs_as_its_own_and_the_explorer_the_published_weights(sync_run):
    """The consistency probe on fp32 vLLM rollouts (on-policy): near-zero differences, no warning; every version the
    explorer loaded has the digest the trainer sent with it."""
    summary, _ = sync_run
    for row in summary["train"]:
        assert row["consistency/version_lag_max"] == 0.0
        assert row["consistency/logprob_diff_mean"] < 1e-3 and row["consistency/k3_kl"] < 1e-5, row
        assert row["consistency/ratio_outside_share"] == 0.0
    loaded = [row for row in summary["weight_versions"] if "weights_digest" in row]
    assert loaded and all(row["digest_match"] == 1.0 for row in loaded)
    assert summary["warnings"] == []


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


def test_tensorboard_holds_every_train_step_written_by_the_trackers_service(sync_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary, output = sync_run
    events = EventAccumulator(str(output / "tensorboard" / summary["run_id"]), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Tensors("train/loss/total")] == [int(row["step"]) for row in summary["train"]]
    evaluated = [int(row["model_version"]) for row in summary["eval"]]
    assert [e.step for e in events.Tensors("eval/accuracy")] == evaluated  # at the versions evaluated


EXPLORER_STEP = ("lease", "rollout", "reward", "put")  # in pipeline order; the reward span lies inside the rollout
TRAINER_STEP = ("read_batch", "prepare", "forward_backward", "optimizer", "publish_weights")


def _timeline(output: Path) -> list[dict]:
    """The run's spans as `trinity run` fetched them through the SDK (`RunHandle.spans`) into timeline.json."""
    return json.loads((output / "timeline.json").read_text())["spans"]


def _phases(spans: list[dict], role: str, step: int) -> dict[str, dict]:
    """The spans of one service role at one step, by phase: those of a step's pipeline come once a step (an
    evaluation may come twice: at an interval, and the final one)."""
    mine = [s for s in spans if s["source"].startswith(f"{role}/") and s["step"] == step]
    once = [s["phase"] for s in mine if s["phase"] in (*EXPLORER_STEP, *TRAINER_STEP, "weight_load")]
    assert len(once) == len(set(once)), f"{role} step {step}: a phase twice in {mine}"
    return {s["phase"]: s for s in mine}


def test_every_span_of_the_timeline_ends_at_or_after_its_start(sync_run):
    spans = _timeline(sync_run[1])
    assert spans and all(0 < s["start_unix_ms"] <= s["end_unix_ms"] for s in spans)


def test_every_step_has_the_phases_of_every_service_in_pipeline_order(sync_run):
    spans = _timeline(sync_run[1])
    for step in (1, 2, 3):
        explorer, trainer = _phases(spans, "explorer", step), _phases(spans, "trainer", step)
        assert set(EXPLORER_STEP) <= set(explorer), f"explorer step {step}: {sorted(explorer)}"
        assert set(TRAINER_STEP) <= set(trainer), f"trainer step {step}: {sorted(trainer)}"
        lease, rollout, reward, put = (explorer[p] for p in EXPLORER_STEP)
        assert lease["end_unix_ms"] <= rollout["start_unix_ms"] <= reward["start_unix_ms"]
        assert reward["end_unix_ms"] <= rollout["end_unix_ms"] <= put["start_unix_ms"]
        ordered = [trainer[p] for p in TRAINER_STEP]
        for before, after in pairwise(ordered):
            assert before["end_unix_ms"] <= after["start_unix_ms"], f"trainer step {step}: {before} then {after}"
        # the pipeline across services: the trainer trains on what this step put, and publishes what the
        # explorer's next step samples with (synchronous: sync_offset 0)
        assert put["start_unix_ms"] <= trainer["read_batch"]["end_unix_ms"]
        if step < 3:
            following = _phases(spans, "explorer", step + 1)
            assert trainer["publish_weights"]["start_unix_ms"] <= following["weight_load"]["start_unix_ms"]
            assert following["weight_load"]["end_unix_ms"] <= following["rollout"]["start_unix_ms"]
            assert following["weight_load"]["model_version"] == step


def test_start_up_and_evaluations_are_on_the_timeline(sync_run):
    spans = _timeline(sync_run[1])
    start_up = {(s["source"].partition("/")[0], s["phase"]) for s in spans if s["step"] == 0}
    assert {("explorer", "engine_start"), ("trainer", "model_load"), ("trainer", "sync_form")} <= start_up
    evaluations = [s for s in spans if s["phase"] == "evaluate"]
    assert [s["model_version"] for s in evaluations] == [0, 2, 3]
    assert evaluations[0]["detail"] == "4 samples"


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


def _serving_run(config: dict, tmp_path: Path) -> str:
    """`trinity run` of `config`, which must SUCCEED, train its 3 steps and serve each version with the trainer's
    digest; the explorer's logs."""
    output = tmp_path / "out"
    done = _trinity_run(write_config(tmp_path / "config.yaml", config), output)
    assert done.returncode == 0, done.stdout + done.stderr + _logs(output)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    assert [row["step"] for row in summary["train"]] == [1.0, 2.0, 3.0]
    published = {row["model_version"]: row["weights_digest"] for row in summary["train"]}
    loaded = [row for row in summary["weight_versions"] if "weights_digest" in row]
    assert [row["model_version"] for row in loaded] == [1.0, 2.0, 3.0]
    assert all(
        row["digest_match"] == 1.0 and row["weights_digest"] == published[row["model_version"]] for row in loaded
    )
    return "".join(p.read_text() for p in (output / "logs").glob("explorer*.log"))


@pytest.mark.system
def test_a_streamed_receive_run_serves_exactly_the_weights_the_trainer_published(tiny_model, tmp_path):
    """`explorer_receive: streamed` (a GPU explorer's default): each verified chunk goes into vLLM as it arrives."""
    config = tiny_config(tiny_model, **{"synchronizer.explorer_receive": "streamed"})
    explorer_logs = _serving_run(config, tmp_path)
    assert '"explorer_receive": "streamed"' in explorer_logs


@pytest.mark.system
def test_an_explorer_split_across_two_vllm_workers_gets_a_rank_for_each_and_serves_the_published_weights(
    tiny_model, tmp_path
):
    """`tensor_parallel_size: 2` on the CPU build: the sync group has the trainer and two worker ranks, each worker
    receives every version itself and loads its shard, and the explorer serves what the trainer published."""
    config = tiny_config(tiny_model, **{"explorer.engine_options": {"tensor_parallel_size": 2}})
    explorer_logs = _serving_run(config, tmp_path)
    assert '"explorer_receive": "workers"' in explorer_logs and '"ranks": 2' in explorer_logs
    # The two workers (the explorer's children, logging to its file) joined as ranks 1 and 2 beside the trainer's 0.
    joined = [json.loads(line) for line in explorer_logs.splitlines() if '"sync.joined"' in line]
    assert {event["rank"] for event in joined} == {1, 2}


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
