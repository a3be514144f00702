"""jemalloc for the processes whose steps allocate and free gigabytes of tensors whose sizes change from step to
step (the trainer and the explorer).

glibc's allocator fragments under that load: a trainer on the quickstart's varying batches grew from 4.4 to 5.5 GB
of peak RSS in 14 steps, and the same steps under jemalloc held at 4.3-4.6 GB (docs/trainer.md, "Memory").
Debian's redis-server depends on jemalloc (libjemalloc2), so a machine that runs `trinity run` usually has it;
without it processes keep the system allocator. `TRINITY_ALLOCATOR=system` keeps it too.
"""

from __future__ import annotations

import ctypes.util
import os

ALLOCATOR_ENV = "TRINITY_ALLOCATOR"


def jemalloc_library() -> str | None:
    """The jemalloc shared library's name as the dynamic loader finds it, or None when it is not installed."""
    name = ctypes.util.find_library("jemalloc")
    return name or None


def with_jemalloc(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child process, with jemalloc preloaded (ahead of any `LD_PRELOAD` it has) when the library is
    installed and `TRINITY_ALLOCATOR` (in `env`, else this process's environment) is not `system`."""
    if env.get(ALLOCATOR_ENV, os.environ.get(ALLOCATOR_ENV, "jemalloc")) == "system":
        return env
    library = jemalloc_library()
    preload = env.get("LD_PRELOAD", "")
    if library is None or "jemalloc" in preload:
        return env
    return {**env, "LD_PRELOAD": f"{library} {preload}".strip()}
