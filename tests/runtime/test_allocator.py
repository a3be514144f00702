"""Which allocator a child process gets (`trinity.runtime.allocator`): jemalloc when it is installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trinity.runtime import allocator
from trinity.runtime.allocator import ALLOCATOR_ENV, jemalloc_library, with_jemalloc

installed = pytest.mark.skipif(jemalloc_library() is None, reason="jemalloc is not installed (Debian: libjemalloc2)")
MAPS = "import sys; sys.stdout.write(open('/proc/self/maps').read())"


@installed
def test_a_child_started_with_the_env_runs_on_jemalloc() -> None:
    env = with_jemalloc({"PATH": "/usr/bin:/bin"})
    maps = subprocess.run([sys.executable, "-c", MAPS], env=env, capture_output=True, text=True, check=True).stdout
    assert "libjemalloc" in maps
    plain = subprocess.run([sys.executable, "-c", MAPS], capture_output=True, text=True, check=True).stdout
    assert "libjemalloc" not in plain


@installed
def test_an_existing_preload_is_kept_after_jemalloc() -> None:
    env = with_jemalloc({"LD_PRELOAD": "libfoo.so"})
    assert env["LD_PRELOAD"].split() == [jemalloc_library(), "libfoo.so"]
    assert with_jemalloc(env) == env  # not twice


def test_the_system_allocator_can_be_chosen() -> None:
    env = {ALLOCATOR_ENV: "system"}
    assert with_jemalloc(env) == env


def test_without_jemalloc_the_env_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    assert with_jemalloc({"A": "1"}) == {"A": "1"}
