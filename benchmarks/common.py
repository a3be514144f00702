"""Shared helpers: percentiles, result files, machine description, measuring child processes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine()}
    payload.update(result)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def run_child(module: str, args: Sequence[str], threads: int, env: Mapping[str, str] | None = None) -> Any:
    """`python -m module *args OUT` in a fresh process from the repository root on `threads` OpenMP threads, and
    the JSON it wrote to OUT. A fresh process gives a measurement its own RSS, caches and thread binding (an
    in-process vLLM engine pins the threads for the rest of its process)."""
    with tempfile.TemporaryDirectory(prefix=f"{module.rsplit('.', 1)[-1]}-") as tmp:
        out = Path(tmp) / "result.json"
        child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        command = [sys.executable, "-m", module, *args, str(out)]
        subprocess.run(command, env=child_env, check=True, cwd=Path(__file__).resolve().parent.parent)
        return json.loads(out.read_text())
