"""benchmarks/process_memory.py: the peak of a process tree's summed RSS, on real processes holding real memory."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.process_memory import ProcessTreeSampler, role_of

ROOT_MB, LEAF_MB = 64, 96
INTERPRETER_MB = 150  # generous: a bare Python interpreter is ~10 MB resident

# Each process fills its memory (so the pages are resident, not merely reserved), says "ready" and holds it
# until its stdin closes. The root starts two leaves first and is ready once both are.
LEAF = """
import sys
held = b"x" * (int(sys.argv[1]) * 1024 * 1024)
print("ready", flush=True)
sys.stdin.read()
"""
TREE_ROOT = """
import subprocess, sys
leaves = [subprocess.Popen([sys.executable, sys.argv[1], sys.argv[3]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True) for _ in range(2)]
for leaf in leaves:
    assert leaf.stdout.readline().strip() == "ready"
held = b"x" * (int(sys.argv[2]) * 1024 * 1024)
print("ready", flush=True)
sys.stdin.read()
for leaf in leaves:
    leaf.stdin.close()
    leaf.wait()
"""


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    (tmp_path / "leaf.py").write_text(LEAF)
    (tmp_path / "tree_root.py").write_text(TREE_ROOT)
    command = [sys.executable, str(tmp_path / "tree_root.py"), str(tmp_path / "leaf.py"), str(ROOT_MB), str(LEAF_MB)]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def _wait_for_samples(sampler: ProcessTreeSampler, count: int) -> None:
    deadline = time.monotonic() + 60  # a bound on a hung thread, not a speed requirement
    while sampler.result().samples < count:
        assert time.monotonic() < deadline, "the sampler thread took no samples"
        time.sleep(0.05)


def test_the_peak_is_the_sum_over_the_root_and_all_its_descendants(tree: subprocess.Popen[str]) -> None:
    with ProcessTreeSampler(tree.pid, interval=0.05) as sampler:
        _wait_for_samples(sampler, 2)  # every sample taken once the whole tree holds its memory
    memory = sampler.result()
    held = ROOT_MB + 2 * LEAF_MB
    assert held <= memory.peak_total_mb <= held + 3 * INTERPRETER_MB
    assert memory.max_processes == 3


def test_each_role_is_charged_the_sum_of_its_processes(tree: subprocess.Popen[str]) -> None:
    sampler = ProcessTreeSampler(tree.pid)
    sampler.sample()
    memory = sampler.result()
    assert set(memory.peak_by_role_mb) == {"tree_root.py", "leaf.py"}
    assert 2 * LEAF_MB <= memory.peak_by_role_mb["leaf.py"] <= 2 * (LEAF_MB + INTERPRETER_MB)
    assert ROOT_MB <= memory.peak_by_role_mb["tree_root.py"] <= ROOT_MB + INTERPRETER_MB
    assert memory.at_peak_mb == memory.peak_by_role_mb  # one sample: the peak's split is that sample


def test_the_peak_outlives_the_tree(tree: subprocess.Popen[str]) -> None:
    sampler = ProcessTreeSampler(tree.pid)
    sampler.sample()
    before = sampler.result().peak_total_mb
    assert tree.stdin is not None
    tree.stdin.close()
    tree.wait(timeout=60)
    sampler.sample()  # the root is reaped: nothing to read, and no error
    after = sampler.result()
    assert after.peak_total_mb == before
    assert after.samples == 2


@pytest.mark.parametrize(
    ("name", "cmdline", "role"),
    [
        (
            "python",
            ["/v/bin/python", "-m", "trinity.runtime.serve", "trainer", "--port", "5"],
            "trinity.runtime.serve trainer",
        ),
        ("python", ["python3", "-u", "-m", "benchmarks.bench_e2e", "--trl-worker"], "benchmarks.bench_e2e"),
        ("python", ["python", "-c", "from multiprocessing.spawn import spawn_main"], "python -c"),
        ("python", ["/usr/bin/python3.11", "/tmp/x/tree_root.py", "a"], "tree_root.py"),
        ("redis-server", ["redis-server 127.0.0.1:6379"], "redis-server"),
        ("VLLM::EngineCore", [], "VLLM::EngineCore"),
    ],
)
def test_a_process_role_names_what_it_runs(name: str, cmdline: list[str], role: str) -> None:
    assert role_of(name, cmdline) == role
