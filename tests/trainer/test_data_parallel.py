"""FSDP2 data parallelism: N ranks train exactly what one process trains, and checkpoints move between rank counts.

Each rank is a real process (`dp_worker.py`) in a real gloo group; the single-process runs have no group.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("dp_worker.py")
GRPO = {"optimizer": {"lr": 1e-4}, "micro_batch_tokens": 64, "mini_batch_size": 8}  # 2 updates per step


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_RUNS: dict[str, dict[str, Any]] = {}  # runs without side effects are shared by the tests that compare with them


def train(tmp: Path, world: int, **args: Any) -> dict[str, Any]:
    """Run `world` ranks of the worker to completion; rank 0's metrics and full weights."""
    key = json.dumps([world, args], sort_keys=True)
    pure = "save" not in args and "load" not in args
    if pure and key in _RUNS:
        return _RUNS[key]
    out = tmp / f"out-{world}-{len(list(tmp.glob('out-*')))}.pt"
    spec = json.dumps({**args, "out": str(out)})
    port = _port()
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port), spec], stderr=subprocess.PIPE)
        for r in range(world)
    ]
    errors = [p.communicate(timeout=240)[1].decode() for p in procs]
    for p, err in zip(procs, errors, strict=True):
        assert p.returncode == 0, err[-3000:]
    result = dict(torch.load(out))
    if pure:
        _RUNS[key] = result
    return result


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(
    ("algorithm", "trainer", "loss"),
    [
        ("grpo", GRPO, "pg_loss"),
        ("dpo", {"optimizer": {"lr": 1e-3}, "micro_batch_tokens": 64}, "dpo_loss"),
        ("ppo", {"optimizer": {"lr": 1e-4}, "micro_batch_tokens": 64}, "vf_loss"),  # the critic is sharded too
        ("grpo", {**GRPO, "lora_rank": 4, "optimizer": {"lr": 1e-3}}, "pg_loss"),  # LoRA merged from shards
    ],
    ids=["grpo", "dpo", "ppo", "grpo-lora"],
)
def test_two_ranks_train_the_weights_one_process_trains(
    tiny_model: Path, tmp_path: Path, algorithm: str, trainer: dict, loss: str
) -> None:
    args = {"model": str(tiny_model), "algorithm": algorithm, "trainer": trainer}
    start = load_file(tiny_model / "model.safetensors")
    one = train(tmp_path, 1, **args, steps=3)
    two = train(tmp_path, 2, **args, steps=3)
    moved = max(float((one["weights"][k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4  # the steps moved the weights: the equality below means something
    assert max_difference(two["weights"], one["weights"]) < 1e-5
    for m1, m2 in zip(one["metrics"], two["metrics"], strict=True):
        assert m2[loss] == pytest.approx(m1[loss], abs=1e-5)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
        assert m2["samples"] == m1["samples"]


@pytest.mark.parametrize(("save_world", "load_world"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_exactly_on_another_rank_count(
    tiny_model: Path, tmp_path: Path, save_world: int, load_world: int
) -> None:
    args = {"model": str(tiny_model), "algorithm": "grpo", "trainer": GRPO}
    checkpoint = tmp_path / "checkpoint"
    uninterrupted = train(tmp_path, 1, **args, steps=3)
    train(tmp_path, save_world, **args, steps=2, save=str(checkpoint))
    resumed = train(tmp_path, load_world, **args, steps=1, load=str(checkpoint))
    assert resumed["step"] == 3
    assert max_difference(resumed["weights"], uninterrupted["weights"]) < 1e-5
    assert resumed["metrics"][0]["pg_loss"] == pytest.approx(uninterrupted["metrics"][2]["pg_loss"], abs=1e-5)
