"""What an engine sets up in the explorer's process: vLLM's workers are spawned (never forked from a process with
gRPC and weight-sync threads), nothing at import, and the device weight updates are received into."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from trinity.explorer.engines.vllm_engine import VllmEngineConfig, _configure_environment

ENGINE_ENV = ("VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")


def test_starting_a_vllm_engine_spawns_its_workers_even_where_fork_was_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENGINE_ENV:  # restored after the test: the engine start writes the process environment
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    _configure_environment(VllmEngineConfig(model_path="unused"))
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_importing_the_engine_and_sync_modules_changes_no_environment() -> None:
    script = (
        "import os; before = dict(os.environ); "
        "import trinity.explorer.engines.vllm_engine, trinity.sync.transport, trinity.sync.collective; "
        "changed = sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k)); "
        "print(changed); raise SystemExit(1 if changed else 0)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_transformers_engine_receives_weights_on_its_models_device(hf_engine) -> None:
    assert hf_engine.device == torch.device("cpu")
