"""Processes of the ranks on the leader's host: start them, watch them, stop them; and dying with a parent.

A local follower is `python -m trinity.trainer.ranks.follower --once` with the torchrun environment. It sets
its own death signal (`die_with_parent`): a `preexec_fn` doing it in the parent deadlocks a process that has
gRPC threads (FACTS.md).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

PARENT_PID_ENV = "TRINITY_RANK_PARENT_PID"
THREADS_ENV = "TRINITY_TRAINER_THREADS"
# The run's rank secret, hex, for a local follower: in its environment (readable by its own user only), never on
# its command line (which every user sees in the process list).
SECRET_ENV = "TRINITY_RANK_SECRET"


def die_with_parent(parent_pid: int) -> None:
    """Exit if the parent dies: PR_SET_PDEATHSIG on Linux, plus a polling thread as a fallback.

    The death signal follows the parent *thread* that started this process, so the parent starts and waits
    for its children from one thread (the run's)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:  # also catches a parent that died before prctl
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def threads_per_rank(threads: int, local_ranks: int) -> int:
    """Torch threads of each of `local_ranks` ranks sharing a host of `threads` (0 = the environment or
    every CPU): one share each, never oversubscribed (FACTS.md: that is ruinous)."""
    total = threads or int(os.environ.get(THREADS_ENV, "0")) or os.cpu_count() or 1
    return max(1, total // local_ranks)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"exit code {code} ({signal.Signals(-code).name})"
    return f"exit code {code}"


class LocalRanks:
    """The follower processes this host runs for one run, ranks `first..first+count-1`."""

    def __init__(
        self,
        *,
        first: int,
        count: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        threads: int,
        secret: bytes | None = None,
    ) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        inherited = {name: value for name, value in os.environ.items() if name != SECRET_ENV}
        for rank in range(first, first + count):
            env: Mapping[str, str] = {
                **inherited,
                **({SECRET_ENV: secret.hex()} if secret is not None else {}),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),  # the leader is local rank 0: local ranks are the first global ones
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                THREADS_ENV: str(threads),
                "OMP_NUM_THREADS": str(threads),
                PARENT_PID_ENV: str(os.getpid()),
            }
            cmd = [sys.executable, "-m", "trinity.trainer.ranks.follower", "--once"]
            self.procs[rank] = subprocess.Popen(cmd, env=env)

    def exited(self) -> dict[int, int]:
        """Exit codes of the ranks that have exited, by rank."""
        return {rank: code for rank, p in self.procs.items() if (code := p.poll()) is not None}

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` for every rank to exit; whether they all did."""
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            p.wait(10.0)
