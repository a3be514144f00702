"""A data-parallel trainer (2 FSDP2 ranks over gloo) feeds 2 explorers: rank 0 publishes, rank 1 gathers along.

Every rank is a real process (`sharded_trainer.py`); the receivers are spawned processes joining the sync group
over gloo. What they receive must equal, tensor for tensor, the `named_weights()` of the same model on one
process, and every digest (rank 0's, taken while streaming; the receivers'; the single process's) must agree.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from tests.sync.conftest import Receivers
from tests.sync.workers import results_by_rank, unpack
from tests.trainer.trainer_helpers import run_config
from trinity.models.digest import weights_digest
from trinity.models.tiny import build_tiny_llama
from trinity.sync import SyncGroupSpec
from trinity.trainer.torch_backend import TorchBackend

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("sharded-sync") / "tiny", vocab_size=320, num_layers=3, seed=7)


def test_a_two_rank_sharded_trainer_feeds_two_explorers_exactly(
    model: Path, tmp_path: Path, receivers: Receivers
) -> None:
    spec_file, out = tmp_path / "spec.json", tmp_path / "report.json"
    args = {
        "model": str(model),
        "name": f"t{uuid.uuid4().hex[:8]}",
        "explorers": 2,
        "bucket_mb": 8192 / 2**20,  # 8 KB buckets: the tiny model streams in many chunks
        "spec_file": str(spec_file),
        "out": str(out),
    }
    port = _port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.sync.sharded_trainer", str(r), "2", str(port), json.dumps(args)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        for r in range(2)
    ]
    try:
        deadline = time.monotonic() + 180
        while not spec_file.exists():
            assert all(r.poll() is None for r in ranks), "a trainer rank exited before the group was reserved"
            assert time.monotonic() < deadline, "rank 0 did not reserve the sync group"
            time.sleep(0.1)
        receivers.spawn(SyncGroupSpec.model_validate_json(spec_file.read_text()), {1: ["ok"], 2: ["ok"]})
        errors = [r.communicate(timeout=240)[1].decode() for r in ranks]
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
    for r, err in zip(ranks, errors, strict=True):
        assert r.returncode == 0, err[-3000:]

    reference = {name: t.clone() for name, t in TorchBackend(run_config(model)).named_weights()}
    report = json.loads(out.read_text())
    assert report["sharded"]  # the weights really were FSDP2 shards, gathered tensor by tensor
    assert report["refused"] == {} and report["tensors"] == len(reference)
    assert report["buckets"] > 2 * len(reference) // 3  # streamed in many chunks, not one
    assert report["digest"] == weights_digest(reference.items())
    for rank, (item,) in results_by_rank(receivers.results, 2, timeout=120).items():
        assert item[2:4] == ("ok", 1), rank
        got = unpack(item[4])
        assert list(got) == list(reference), rank  # the single process's names, in its order
        for name, tensor in reference.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (rank, name)
        assert weights_digest(got.items()) == report["digest"], rank
