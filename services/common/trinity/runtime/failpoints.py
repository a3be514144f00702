"""Failpoints: named places where a test stops a process at the worst moment, to kill it there.

With `TRINITY_FAILPOINTS_DIR` set, `failpoint(name)` checks for a file `<dir>/<name>` (the failpoint is armed).
The first process to reach an armed failpoint renames the file to `<name>.reached` (so exactly one process
stops there, and its replacement, started with the same environment, does not), logs `failpoint.reached` and
sleeps for the seconds written in the file (default `PAUSE_S`): long enough for the test to SIGKILL it, bounded so
a test that forgets never hangs a run. Without the variable a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from trinity.runtime.logging import get_logger

ENV = "TRINITY_FAILPOINTS_DIR"
PAUSE_S = 300.0
REACHED = ".reached"

log = get_logger(__name__)


def failpoint(name: str) -> None:
    """Pause here if `name` is armed (see the module docstring); a no-op otherwise."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    armed = Path(directory) / name
    reached = armed.with_name(name + REACHED)
    try:
        seconds = float(armed.read_text().strip() or PAUSE_S)
        armed.rename(reached)
    except (FileNotFoundError, ValueError):
        return
    log.warning("failpoint.reached", name=name, pid=os.getpid(), pause_seconds=seconds)
    reached.write_text(str(os.getpid()))
    time.sleep(seconds)


def arm(directory: Path, name: str, pause_s: float = PAUSE_S) -> None:
    """Arm `name` in `directory` (the value of `TRINITY_FAILPOINTS_DIR` of the processes under test)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(str(pause_s))


def reached_by(directory: Path, name: str, timeout: float) -> int:
    """The pid of the process paused at `name`, once one is; TimeoutError after `timeout` seconds."""
    marker = directory / (name + REACHED)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = marker.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    raise TimeoutError(f"no process reached failpoint {name} within {timeout:.0f}s")
