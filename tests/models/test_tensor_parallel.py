"""An engine split across two vLLM workers (the CPU build's tensor parallelism): each worker is a rank of the weight
sync group, receives every version itself and loads its own shard, and the engine then samples what the trainer
trained, to the matrix's tolerance.

The trainer's sender is in the test process (rank 0); the engine's two workers are ranks 1 and 2, joined through
vLLM's weight-transfer API with Trinity's transfer engine (`vllm_worker.TrinityTransferEngine`).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import torch

from tests.models.conftest import SIZES
from tests.models.test_engine_matrix import LOGPROB_TOL, _rollouts, _rows, _sample, _split
from tests.trainer.trainer_helpers import grpo_parts, run_config
from trinity.explorer.engines.vllm_engine import VllmEngine
from trinity.models.digest import weights_digest
from trinity.models.tiny import build_tiny_model
from trinity.sync import SyncGroupSpec, WeightSender, reserve_rendezvous
from trinity.trainer.torch_backend import TorchBackend

pytestmark = pytest.mark.models


def test_two_workers_each_receive_the_version_and_the_engine_samples_the_trained_policy(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", "llama", tie_word_embeddings=False, **SIZES)
    engine = VllmEngine(model_path=str(model), seed=0, kv_cache_space_gib=0.25, block_size=32, tensor_parallel_size=2)
    try:
        assert engine.sync_ranks == 2
        before = _sample(engine)
        backend = TorchBackend(run_config(model, optimizer={"lr": 1e-2}), algorithm=grpo_parts())
        backend.train_step(_rollouts(before, backend.model_version))

        # The engine's two workers take ranks 1 and 2 (the gateway names the second "<explorer>#1").
        spec = SyncGroupSpec.for_members(
            f"tp{uuid.uuid4().hex[:8]}", 0, ["explorer-0", "explorer-0#1"], timeout_s=60, bucket_mb=0.05
        )
        rendezvous = reserve_rendezvous(spec)
        sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
        joined = threading.Thread(target=sender.init)
        joined.start()
        engine.join_sync_group(rendezvous.spec, 1)
        joined.join()
        reports: list = []
        publishing = threading.Thread(target=lambda: reports.append(sender.publish(1, backend.named_weights())))
        publishing.start()
        loaded, published = engine.receive_version(1)
        publishing.join(60)
        engine.leave_sync_group()
        sender.close()

        assert reports and reports[0].accepted_by_all  # both workers accepted: ranks 1 and 2 each reported
        assert loaded == published == weights_digest(backend.named_weights())
        assert engine.model_version == 1
        after = _sample(engine)
    finally:
        engine.close()

    engine_logprobs = [torch.tensor(s.logprobs) for r in after for s in r.samples]
    trained = _split(backend.forward_rows(_rows(after), "policy"), after)
    initial = _split(TorchBackend(run_config(model)).forward_rows(_rows(after), "policy"), after)
    for mine, theirs in zip(engine_logprobs, trained, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=LOGPROB_TOL)
    assert max(float((m - i).abs().max()) for m, i in zip(engine_logprobs, initial, strict=True)) > 100 * LOGPROB_TOL
