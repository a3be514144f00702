"""Helpers for tests of waiting calls: what a process waits for in Redis, and waiting on a condition."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil
import redis


def blocked_reads(redis_url: str, pid: int) -> int:
    """How many of process `pid`'s Redis connections are blocked in XREAD (a waiting long poll or watch)."""
    ports = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")}
    with redis.Redis.from_url(redis_url) as client:
        return sum(
            1
            for c in client.client_list()
            if c["cmd"] == "xread" and "b" in c["flags"] and int(c["addr"].rsplit(":", 1)[1]) in ports
        )


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)
