"""Shared helpers: percentiles, result files, machine description, measuring child processes."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
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


def run_child(
    module: str,
    args: Sequence[str],
    threads: int,
    env: Mapping[str, str] | None = None,
    *,
    timeout_s: float | None = None,
    log: Path | None = None,
) -> Any:
    """`python -m module *args OUT` in a fresh process from the repository root on `threads` OpenMP threads, and
    the JSON it wrote to OUT. A fresh process gives a measurement its own RSS, caches and thread binding (an
    in-process vLLM engine pins the threads for the rest of its process).

    A failed child raises `subprocess.CalledProcessError`. With `timeout_s` the child runs in a session of its
    own and is killed with every process it started when the time is up (`subprocess.TimeoutExpired`); with
    `log` its output is appended there instead of passing through."""
    with tempfile.TemporaryDirectory(prefix=f"{module.rsplit('.', 1)[-1]}-") as tmp:
        out = Path(tmp) / "result.json"
        child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        command = [sys.executable, "-m", module, *args, str(out)]
        with contextlib.ExitStack() as stack:
            sink = stack.enter_context(log.open("ab")) if log is not None else None
            child = subprocess.Popen(
                command,
                env=child_env,
                cwd=Path(__file__).resolve().parent.parent,
                stdout=sink,
                stderr=subprocess.STDOUT if sink is not None else None,
                start_new_session=timeout_s is not None,
            )
            try:
                child.wait(timeout=timeout_s)
            except BaseException:  # the time is up, or this process is interrupted: the child must not outlive it
                if timeout_s is not None:
                    os.killpg(child.pid, signal.SIGKILL)
                else:
                    child.kill()
                child.wait()
                raise
        if child.returncode != 0:
            raise subprocess.CalledProcessError(child.returncode, command)
        return json.loads(out.read_text())
