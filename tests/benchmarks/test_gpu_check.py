"""benchmarks/gpu_check.py where there is no GPU: it refuses at once; its accounting (ok / failed / not-run, where
only ok passes), its part registry and its child processes (a failing part, a part past its limit) are checked
here. The parts themselves need a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

pytestmark = pytest.mark.skipif(
    gpu_check.cuda_problem() is None, reason="a CUDA device is here: run the check itself (make gpu-check)"
)


def test_without_a_cuda_device_it_fails_fast_saying_so(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == gpu_check.NO_CUDA_EXIT
    assert "gpu_check: no CUDA device" in done.stderr
    assert time.monotonic() - started < 30  # no part was started
    assert json.loads((tmp_path / "gpu_check.json").read_text())["error"].startswith("no CUDA device")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_gpu_check_stops_at_the_device_check_before_fetching_anything(tmp_path):
    done = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", f"GPU_PYTHON={sys.executable}", f"GPU_WHEELS={tmp_path}/w"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "no CUDA device" in done.stderr
    assert not (tmp_path / "w").exists()


def test_an_unknown_part_is_refused_naming_it():
    done = subprocess.run([sys.executable, str(SCRIPT), "--parts", "versions,nccl"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown part(s) ['nccl']; known: versions, nccl_publish" in done.stderr


def test_the_tolerance_is_absolute_plus_relative():
    assert gpu_check.within(1.03, 1.0, (0.02, 0.02))
    assert not gpu_check.within(1.05, 1.0, (0.02, 0.02))
    assert gpu_check.within(-0.015, 0.0, (0.02, 0.0)) and not gpu_check.within(0.1, 0.0, (0.02, 0.5))


def test_the_registry_holds_the_documented_parts_in_order():
    assert list(gpu_check.PARTS) == [
        "versions",
        "nccl_publish",
        "nccl_two_ranks_one_gpu",
        "cuda_ipc_2gib",
        "engine_under_pressure",
        "trainer_parity",
        "fsdp2_nccl",
        "model_1p5b",
    ]


def test_every_part_gets_its_whole_limit_within_five_minutes():
    assert sum(p.limit_s for p in gpu_check.PARTS.values()) <= gpu_check.BUDGET_S <= 300


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"ok": True}, "ok"),
        ({"ok": False}, "failed"),
        ({"error": "versions: exit code 1"}, "failed"),
        ({"not_run": "the 300s budget was spent"}, "not-run"),
        ({"ok": True, "not_run": "could not start"}, "not-run"),
        (None, "not-run"),
    ],
)
def test_only_a_result_that_says_ok_is_ok(result, status):
    assert gpu_check.status_of(result) == status


def test_the_check_passes_only_when_every_part_is_ok():
    results = {name: {"ok": True} for name in gpu_check.PARTS}
    summary = gpu_check.summarize(results)
    assert summary["passed"] and gpu_check.exit_code(summary) == 0
    assert summary["failed"] == summary["not_run"] == []


def test_a_part_that_did_not_run_fails_the_check_and_is_listed():
    results = {name: {"ok": True} for name in gpu_check.PARTS}
    results["fsdp2_nccl"] = {"not_run": "not selected (--parts)"}
    del results["model_1p5b"]
    summary = gpu_check.summarize(results)
    assert gpu_check.exit_code(summary) == 1
    assert summary["not_run"] == ["fsdp2_nccl", "model_1p5b"] and summary["failed"] == []


def test_a_failed_part_fails_the_check_and_is_listed():
    results = {name: {"ok": True} for name in gpu_check.PARTS}
    results["cuda_ipc_2gib"] = {"ok": False}
    summary = gpu_check.summarize(results)
    assert gpu_check.exit_code(summary) == 1 and summary["failed"] == ["cuda_ipc_2gib"]


def test_unselected_parts_are_recorded_as_not_run_and_selected_ones_run_within_their_limit():
    calls = []

    def run(entry, limit_s):
        calls.append((entry.name, limit_s))
        return {"ok": True}

    results = gpu_check.run_parts(["versions", "fsdp2_nccl"], budget_s=300, run=run)
    assert [name for name, _ in calls] == ["versions", "fsdp2_nccl"]
    assert all(limit == gpu_check.PARTS[name].limit_s for name, limit in calls)
    assert results["nccl_publish"] == {"not_run": "not selected (--parts)"}
    assert list(results) == list(gpu_check.PARTS)


def test_parts_after_the_budget_is_spent_are_not_run():
    def run(entry, limit_s):
        time.sleep(0.3)
        return {"ok": True}

    results = gpu_check.run_parts(list(gpu_check.PARTS), budget_s=5.2, run=run)
    assert results["versions"] == {"ok": True}
    assert results["nccl_publish"] == {"not_run": "the 5s budget was spent"}


def test_a_part_that_raises_in_its_child_is_failed_with_its_output(tmp_path):
    # Here the versions part reaches torch.cuda.get_device_properties on a CPU build and raises.
    result = gpu_check.run_part(gpu_check.PARTS["versions"], limit_s=120, log=tmp_path / "parts.log")
    assert gpu_check.status_of(result) == "failed"
    assert result["error"] == "versions: exit code 1" and "Traceback" in result["log_tail"]


def test_a_part_past_its_limit_is_killed_with_its_children_and_failed(tmp_path):
    started = time.monotonic()
    result = gpu_check.run_part(gpu_check.PARTS["versions"], limit_s=1.0, log=tmp_path / "parts.log")
    assert time.monotonic() - started < 15
    assert gpu_check.status_of(result) == "failed" and result["error"] == "versions: timed out after 1s"
