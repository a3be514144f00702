"""`trinity run` writes TensorBoard, MLflow and W&B through the trackers service it starts beside the others, the one
code path a deployed stack uses: every train step of a real (tiny) run, at its step, under the output folder."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import tiny_config, write_config
from tests.e2e.test_run import _logs, _trinity_run
from tests.trackers.wandb_files import read_runs, series

pytestmark = pytest.mark.system


def test_a_local_run_lands_in_every_tracker_under_its_output(tiny_model, tmp_path, monkeypatch):
    monitor = {"tensorboard": True, "mlflow": True, "wandb": True, "project": "tiny"}
    config = write_config(tmp_path / "config.yaml", tiny_config(tiny_model, monitor=monitor))
    output = tmp_path / "out"
    done = _trinity_run(config, output)
    assert done.returncode == 0, done.stdout + done.stderr + _logs(output)
    summary = json.loads((output / "summary.json").read_text())
    losses = [(int(row["step"]), row["loss/total"]) for row in summary["train"]]
    assert [step for step, _ in losses] == [1, 2, 3]

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens a file store only when told it may
    client = MlflowClient(tracking_uri=(output / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`trinity.run_id` = '{summary['run_id']}'")
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss.total"))
    assert history == losses
    assert run.info.status == "FINISHED" and run.data.tags["trinity.final_model_path"] == summary["final_model_path"]

    offline = read_runs(output / "wandb", summary["run_id"])
    assert series(offline, "train/loss/total", "train/step") == losses
    evaluated = [int(row["model_version"]) for row in summary["eval"]]  # at the versions evaluated
    assert [x for x, _ in series(offline, "eval/accuracy", "eval/step")] == evaluated
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy.heldout")] == evaluated
    assert any((output / "tensorboard" / summary["run_id"]).glob("events.out.tfevents.*"))
    assert f"mlflow ui --backend-store-uri {(output / 'mlruns').as_uri()}" in done.stdout
