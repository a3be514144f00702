"""An engine split across two vLLM workers (the CPU build's tensor parallelism): each worker is a rank of the weight
sync group, receives every version itself and loads its own shard, and the engine then samples what the trainer
trained, to the matrix's tolerance; an update that fails part-way tears the engine until the next generation's
version mends it.

The trainer's sender is in the test process (rank 0); the engine's two workers are ranks 1 and 2, joined through
vLLM's weight-transfer API with Trinity's transfer engine (`vllm_worker.TrinityTransferEngine`).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.models.conftest import SIZES
from tests.models.test_engine_matrix import LOGPROB_TOL, _rollouts, _rows, _sample, _split
from tests.trainer.trainer_helpers import grpo_parts, run_config
from trinity.explorer.engines.base import WeightsTorn
from trinity.explorer.engines.vllm_engine import VllmEngine
from trinity.models.digest import weights_digest
from trinity.models.tiny import build_tiny_model
from trinity.sync import SyncError, SyncGroupSpec, WeightSender, reserve_rendezvous
from trinity.sync.spec import Rendezvous
from trinity.trainer.torch_backend import TorchBackend

pytestmark = pytest.mark.models

# The gateway names an explorer's second worker rank "<explorer>#1".
WORKERS = ["explorer-0", "explorer-0#1"]


@pytest.fixture
def trained(tmp_path: Path) -> Iterator[tuple[Path, VllmEngine, TorchBackend]]:
    """The tiny Llama split across two workers, its first samples, and a trainer one step on from them."""
    model = build_tiny_model(tmp_path / "model", "llama", tie_word_embeddings=False, **SIZES)
    engine = VllmEngine(model_path=str(model), seed=0, kv_cache_space_gib=0.25, block_size=32, tensor_parallel_size=2)
    try:
        assert engine.sync_ranks == 2
        backend = TorchBackend(run_config(model, optimizer={"lr": 1e-2}), algorithm=grpo_parts())
        backend.train_step(_rollouts(_sample(engine), backend.model_version))
        yield model, engine, backend
    finally:
        engine.close()


def _form(engine: VllmEngine, rendezvous: Rendezvous, spec: SyncGroupSpec) -> WeightSender:
    """The trainer's sender and the engine's two worker ranks joined as one group."""
    sender = WeightSender(spec, rendezvous=rendezvous)
    joined = threading.Thread(target=sender.init)
    joined.start()
    engine.join_sync_group(spec, 1)
    joined.join()
    return sender


def _sync_whole_version(
    engine: VllmEngine, backend: TorchBackend, rendezvous: Rendezvous, spec: SyncGroupSpec
) -> tuple[int, int | None]:
    """Version 1 from the trainer to the engine's two worker ranks, accepted by both; (loaded, published) digests."""
    sender = _form(engine, rendezvous, spec)
    with ThreadPoolExecutor(1) as pool:  # the trainer publishes while the engine's workers receive
        publishing = pool.submit(sender.publish, 1, backend.named_weights())
        digests = engine.receive_version(1)
        assert publishing.result(60).accepted_by_all  # ranks 1 and 2 each reported and accepted
    engine.leave_sync_group()
    sender.close()
    return digests


def _assert_samples_the_trained_policy(engine: VllmEngine, model: Path, backend: TorchBackend) -> None:
    after = _sample(engine)
    engine_logprobs = [torch.tensor(s.logprobs) for r in after for s in r.samples]
    trained = _split(backend.forward_rows(_rows(after), "policy"), after)
    initial = _split(TorchBackend(run_config(model)).forward_rows(_rows(after), "policy"), after)
    for mine, theirs in zip(engine_logprobs, trained, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=LOGPROB_TOL)
    assert max(float((m - i).abs().max()) for m, i in zip(engine_logprobs, initial, strict=True)) > 100 * LOGPROB_TOL


def test_two_workers_each_receive_the_version_and_the_engine_samples_the_trained_policy(
    trained: tuple[Path, VllmEngine, TorchBackend],
) -> None:
    model, engine, backend = trained
    spec = SyncGroupSpec.for_members(f"tp{uuid.uuid4().hex[:8]}", 0, WORKERS, timeout_s=60, bucket_mb=0.05)
    rendezvous = reserve_rendezvous(spec)
    loaded, published = _sync_whole_version(engine, backend, rendezvous, rendezvous.spec)
    assert loaded == published == weights_digest(backend.named_weights())
    assert engine.model_version == 1 and engine.torn is None
    _assert_samples_the_trained_policy(engine, model, backend)


def test_an_update_that_fails_part_way_tears_the_engine_and_the_next_generation_mends_it(
    trained: tuple[Path, VllmEngine, TorchBackend],
) -> None:
    model, engine, backend = trained
    spec = SyncGroupSpec.for_members(f"tp{uuid.uuid4().hex[:8]}", 0, WORKERS, timeout_s=5, bucket_mb=0.05)
    rendezvous = reserve_rendezvous(spec)
    sender = _form(engine, rendezvous, rendezvous.spec)

    def gather_fails_half_way() -> Iterator[tuple[str, torch.Tensor]]:
        weights = list(backend.named_weights())
        yield from weights[: len(weights) // 2]
        raise RuntimeError("the trainer's gather failed")

    with ThreadPoolExecutor(1) as pool:
        publishing = pool.submit(sender.publish, 1, gather_fails_half_way())
        with pytest.raises(SyncError, match="the engine's workers failed weight version 1: rank 1: SyncError"):
            engine.receive_version(1)
        assert isinstance(publishing.exception(60), RuntimeError)
    # Whole layers of version 1 were loaded before the failure, the rest is version 0's: nothing may be sampled.
    assert engine.torn is not None and engine.model_version == 0
    with pytest.raises(WeightsTorn):
        _sample(engine)
    engine.leave_sync_group()
    sender.close()

    # The next generation (as the trainer's publisher re-forms after a failure) brings the whole version.
    next_spec = rendezvous.next_generation(WORKERS, timeout_s=60, bucket_mb=0.05)
    loaded, published = _sync_whole_version(engine, backend, rendezvous, next_spec)
    assert loaded == published == weights_digest(backend.named_weights())
    assert engine.torn is None and engine.model_version == 1
    _assert_samples_the_trained_policy(engine, model, backend)
