"""The trainer killed (SIGKILL) at the worst moments of a checkpoint: its files written but not yet renamed into
place, and renamed but `latest` not yet moved. Either way the checkpoint `latest` names is complete and loads, nothing
half-written is ever loaded, and the next save of the same step succeeds over the leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import random_rollouts, run_config

from trinity.trainer.checkpoint import resolve
from trinity.trainer.torch_backend import TorchBackend

HERE = Path(__file__).resolve().parent

# A trainer that saves step 1, then stops dead at `pause` inside step 2's save (it prints PAUSED and sleeps until
# killed): `rename` = the step's files are all written under `.step_2.partial`, not yet renamed; `latest` = renamed
# to `step_2`, the `latest` file not yet moved.
CHILD = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from trainer_helpers import random_rollouts, run_config
from trinity.trainer import checkpoint
from trinity.trainer.torch_backend import TorchBackend

model, root, pause = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
backend = TorchBackend(run_config(model, "grpo", save_interval=1), root)
backend.train_step(random_rollouts(4, seed=0))
real = os.replace

def paused(src, dst):
    name = Path(src).name if pause == "rename" else Path(dst).name
    if name == (".step_2.partial" if pause == "rename" else "latest"):
        print("PAUSED", flush=True)
        time.sleep(3600)
    real(src, dst)

checkpoint.os.replace = paused  # this process's os module only: it is killed at the pause
backend.train_step(random_rollouts(4, seed=1))
"""


def _backend(model: Path, root: Path) -> TorchBackend:
    return TorchBackend(run_config(model, "grpo", save_interval=1), root)


@pytest.mark.parametrize("pause", ["rename", "latest"])
def test_a_trainer_killed_mid_checkpoint_leaves_the_newest_complete_one_loadable(
    tiny_model: Path, tmp_path: Path, pause: str
) -> None:
    root = tmp_path / "ckpt"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tiny_model), str(root), pause, str(HERE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        lines = (line.strip() for line in child.stdout)  # its log lines, then PAUSED (EOF if it failed first)
        assert "PAUSED" in lines, "the child trainer never reached step 2's save"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    assert (root / "latest").read_text() == "step_1"
    assert resolve(root) == root / "step_1"
    left = sorted(p.name for p in root.iterdir())
    written = [".step_2.partial"] if pause == "rename" else [".latest.tmp", "step_2"]  # the killed save's leftovers
    assert left == sorted(["latest", "step_1", *written])

    resumed = _backend(tiny_model, tmp_path / "unused")
    resumed.load_checkpoint(root)
    assert (resumed.step, resumed.model_version) == (1, 1)
    # The resumed run trains step 2 again and its save replaces what the killed one left.
    again = _backend(tiny_model, root)
    again.load_checkpoint(root)
    again.train_step(random_rollouts(4, seed=1))
    assert (root / "latest").read_text() == "step_2"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1", "step_2"]
    assert resolve(root) == root / "step_2"
