"""Peak resident memory of a whole process tree, sampled from a thread.

`ru_maxrss` sees one process (or, for RUSAGE_CHILDREN, the largest waited-for child), never the sum of a
stack's processes alive at the same moment: `trinity run` starts Redis, a gateway, a buffer, a trainer and an
explorer, and what a machine must hold is their sum. This samples the root and every descendant every
`interval` seconds and keeps the peak of that sum, the peak of each role's share, and the split at the peak.

RSS counts pages shared between processes (the torch libraries each service maps) once per process, so a
stack of many processes is charged more than the memory it takes: the figure cannot flatter a stack.

    with ProcessTreeSampler(proc.pid) as sampler:
        proc.wait()
    print(sampler.result().peak_total_mb)
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import psutil

MB = 1024 * 1024


def role_of(name: str, cmdline: list[str]) -> str:
    """A short, stable label for a process: `python -m trinity.runtime.serve trainer` -> `trinity.runtime.serve
    trainer`, `python tree.py` -> `tree.py`, `redis-server 127.0.0.1:6379` -> `redis-server`."""
    if not cmdline or "python" not in os.path.basename(cmdline[0]):
        return name
    args = cmdline[1:]
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):  # interpreter flags: -u, -X ...
        args = args[1:]
    if not args:
        return name
    if args[0] == "-c":  # multiprocessing's spawned workers and the like: their code says nothing short
        return "python -c"
    if args[0] == "-m" and len(args) > 1:
        module, rest = args[1], args[2:]
        return f"{module} {rest[0]}" if rest and not rest[0].startswith("-") else module
    return os.path.basename(args[0])


@dataclass
class TreeMemory:
    """What a sampler saw: peaks in MB of the tree's summed RSS, and of each role's summed RSS."""

    peak_total_mb: float = 0.0
    peak_by_role_mb: dict[str, float] = field(default_factory=dict)
    at_peak_mb: dict[str, float] = field(default_factory=dict)  # each role's share when the total peaked
    max_processes: int = 0
    samples: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_total_mb": round(self.peak_total_mb, 1),
            "peak_by_role_mb": {k: round(v, 1) for k, v in sorted(self.peak_by_role_mb.items())},
            "at_peak_mb": {k: round(v, 1) for k, v in sorted(self.at_peak_mb.items(), key=lambda kv: -kv[1])},
            "max_processes": self.max_processes,
            "samples": self.samples,
        }


class ProcessTreeSampler:
    """Samples the summed RSS of process `pid` and all its descendants until stopped."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self._root = psutil.Process(pid)
        self._interval = interval
        self._memory = TreeMemory()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"rss-sampler-{pid}", daemon=True)

    def start(self) -> ProcessTreeSampler:
        self._thread.start()
        return self

    def stop(self) -> TreeMemory:
        self._stop.set()
        self._thread.join()
        return self.result()

    def result(self) -> TreeMemory:
        with self._lock:
            m = self._memory
            return TreeMemory(m.peak_total_mb, dict(m.peak_by_role_mb), dict(m.at_peak_mb), m.max_processes, m.samples)

    def __enter__(self) -> ProcessTreeSampler:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def sample(self) -> None:
        """One reading of the tree, folded into the peaks (the thread calls this; so may a caller)."""
        by_role: dict[str, float] = {}
        count = 0
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:  # the root is gone (reaped): nothing left to see
            tree = []
        for proc in tree:
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    role = role_of(proc.name(), proc.cmdline())
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue  # exited between the listing and the reading
            by_role[role] = by_role.get(role, 0.0) + rss / MB
            count += 1
        total = sum(by_role.values())
        with self._lock:
            m = self._memory
            m.samples += 1
            m.max_processes = max(m.max_processes, count)
            for role, mb in by_role.items():
                m.peak_by_role_mb[role] = max(m.peak_by_role_mb.get(role, 0.0), mb)
            if total > m.peak_total_mb:
                m.peak_total_mb, m.at_peak_mb = total, by_role

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self._interval):
                return
