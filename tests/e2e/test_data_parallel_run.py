"""`trinity run` with a 2-rank FSDP2 trainer: the service process is rank 0, it starts rank 1 itself, and the
explorer receives full weights gathered from the shards over the gloo sync group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import tiny_config, write_config
from tests.e2e.test_run import _logs, _trinity_run

pytestmark = pytest.mark.system  # a whole run with two trainer ranks: minutes on 2 cores


@pytest.fixture(scope="module")
def dp_run(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp-run")
    config = tiny_config(tiny_model, **{"trainer.data_parallel_size": 2, "trainer.save_interval": 2})
    done = _trinity_run(write_config(tmp / "config.yaml", config), tmp / "out")
    assert done.returncode == 0, done.stdout + done.stderr + _logs(tmp / "out")
    return json.loads((tmp / "out" / "summary.json").read_text()), tmp / "out"


def test_a_two_rank_trainer_trains_every_step_and_the_explorer_serves_its_weights(dp_run):
    summary, _ = dp_run
    assert summary["state"] == "RUN_STATE_SUCCEEDED"
    assert [row["step"] for row in summary["train"]] == [1.0, 2.0, 3.0]
    published = {row["model_version"]: row["weights_digest"] for row in summary["train"]}
    loaded = {r["model_version"]: r["weights_digest"] for r in summary["weight_versions"] if "weights_digest" in r}
    assert sorted(loaded) == [1.0, 2.0, 3.0]
    assert all(loaded[v] == published[v] for v in loaded)  # full tensors gathered from the shards, bit for bit
    assert len(set(published.values())) == 3


def test_every_experience_is_acknowledged_once_after_both_ranks_committed(dp_run):
    summary, _ = dp_run
    counts = summary["experience_counts"]["stage0"]
    assert counts["put"] == counts["acked"] == 24
    assert counts["pending"] == counts["undelivered"] == counts["dead_letters"] == 0
    final = Path(summary["final_model_path"])
    assert (final / "config.json").exists() and any(final.glob("*.safetensors"))
