"""benchmarks/gpu_check.py where there is no GPU: it refuses at once, and its parts' logic (the bf16-vs-fp32
comparison, the weight-sync and CUDA IPC round trips, the time limit) runs on the CPU."""

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
    done = subprocess.run([sys.executable, str(SCRIPT), "--parts", "torch,nccl"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown part(s) ['nccl']; known: torch, sync, cuda_ipc, megatron" in done.stderr


def test_the_tolerance_is_absolute_plus_relative():
    assert gpu_check.within(1.03, 1.0, (0.02, 0.02))
    assert not gpu_check.within(1.05, 1.0, (0.02, 0.02))
    assert gpu_check.within(-0.015, 0.0, (0.02, 0.0)) and not gpu_check.within(0.1, 0.0, (0.02, 0.5))


def test_the_torch_part_compares_bf16_steps_with_the_fp32_reference():
    result = gpu_check.check_torch_backend("cpu")
    assert [s["step"] for s in result["steps"]] == [1, 2, 3]
    for step in result["steps"]:
        assert step["candidate"]["loss/total"] != step["reference"]["loss/total"]  # really another precision
        assert all(step["within_tolerance"].values()), step
    assert result["ok"] is True


def test_the_sync_part_verifies_every_tensor_it_received():
    result = gpu_check.check_sync("cpu", layers=1, rounds=3, verified=2)
    assert result["backend"] == "gloo" and result["mismatches"] == [] and result["ok"] is True
    assert result["bytes"] > 49152 * 576 * 4 // 2 and result["gb_per_s"] > 0  # the embedding at least


def test_the_megatron_part_compares_tp1_with_the_torch_backend():
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    result = gpu_check.check_megatron("cpu", steps=2, warmup=1, batch=4)
    assert result["export_equals_checkpoint"] is True and result["ok"] is True
    assert result["first_step_loss_diff"] < 1e-3 and result["megatron_tp1"]["tokens_per_s"] > 0


def test_a_part_past_its_limit_is_killed_with_its_children_and_reported(tmp_path):
    started = time.monotonic()
    result = gpu_check.run_part("sync", "cpu", limit_s=1.0, log=tmp_path / "parts.log")
    assert time.monotonic() - started < 15
    assert result["ok"] is False and result["error"] == "sync: timed out after 1s"
