"""Every family end to end: vLLM (CPU build) samples it, the trainer trains on those samples, weight sync delivers
the trained weights into the engine, and the Megatron backend scores it where its mapping claims the architecture.

One scenario per family, run once (`outcome`); the tests read it. Tolerance of the engine against the trainer:
1e-4 on the log-prob of each sampled token, both sides float32 (docs/explorer.md, docs/models.md).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.sync.loopback import loopback_pair
from tests.trainer.trainer_helpers import grpo_parts, run_config
from trinity.explorer.engines import GenerationRequest, GenerationResult, SamplingSettings, create_engine
from trinity.explorer.engines.base import Engine
from trinity.models.digest import weights_digest
from trinity.trainer.batch import TokenSequence, to_samples
from trinity.trainer.megatron.hf_mapping import SUPPORTED_ARCHITECTURES
from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2

pytestmark = pytest.mark.models

LOGPROB_TOL = 1e-4
MESSAGES = ([{"role": "user", "content": "Tell me a story about a lake."}], [{"role": "user", "content": "2+2?"}])
SAMPLING = SamplingSettings(temperature=1.0, max_tokens=20)


@dataclass
class Outcome:
    model_dir: Path
    before: list[GenerationResult]
    train_metrics: dict[str, float]
    published_digest: int | None
    received_digest: int
    loaded_version: int
    after: list[GenerationResult]
    trainer_after: list[torch.Tensor]  # the trained policy's log-probs of each result's samples in `after`
    initial_after: list[torch.Tensor]  # the untrained model's log-probs of the same tokens


def _sample(engine: Engine) -> list[GenerationResult]:
    requests = [GenerationRequest(messages=m, n=4, sampling=SAMPLING) for m in MESSAGES]
    return engine.generate(requests)


def _rollouts(results: list[GenerationResult], version: int) -> list[common_pb2.Experience]:
    """Each prompt's samples as one GRPO group, the sampler's log-probs kept; alternate rewards give every
    sample a nonzero advantage."""
    return [
        common_pb2.Experience(
            id=f"p{p}-{i}",
            kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
            group_id=f"p{p}",
            model_version=version,
            prompt_token_ids=result.prompt_token_ids,
            response_token_ids=sample.token_ids,
            logprobs=sample.logprobs,
            reward=float(i % 2),
        )
        for p, result in enumerate(results)
        for i, sample in enumerate(result.samples)
    ]


def _rows(results: list[GenerationResult]) -> list[TokenSequence]:
    return [
        TokenSequence(prompt=list(r.prompt_token_ids), response=s.token_ids, action_mask=[True] * len(s.token_ids))
        for r in results
        for s in r.samples
    ]


def _split(scores: torch.Tensor, results: list[GenerationResult]) -> list[torch.Tensor]:
    """`[rows, max_resp]` scores -> each sample's own `[len]` log-probs, in `_rows` order."""
    lengths = [len(s.token_ids) for r in results for s in r.samples]
    return [scores[i, :n] for i, n in enumerate(lengths)]


def _sync(backend: TorchBackend, engine: Engine, version: int) -> tuple[int | None, int, int]:
    """Publish the policy through the gloo sync group into the engine, as the explorer stages and loads it.
    Returns (the digest the trainer published, the digest of what was received, the engine's version)."""
    sender, receiver = loopback_pair(timeout_s=60, bucket_mb=0.05)
    publishing = threading.Thread(target=sender.publish, args=(version, backend.named_weights()))
    publishing.start()
    received: list[tuple[str, torch.Tensor]] = []
    try:
        assert receiver.receive_into(lambda _v, named: received.extend((n, t.clone()) for n, t in named)) == version
        publishing.join()
        engine.load_weights(version, received)
        return receiver.published_digest, weights_digest(received), engine.model_version
    finally:
        sender.close()
        receiver.close()


@pytest.fixture(scope="module")
def outcome(family_model: Path) -> Outcome:
    engine = create_engine("vllm", model_path=str(family_model), seed=0, kv_cache_space_gib=0.25, block_size=32)
    try:
        before = _sample(engine)
        backend = TorchBackend(run_config(family_model, optimizer={"lr": 1e-2}), algorithm=grpo_parts())
        metrics = backend.train_step(_rollouts(before, backend.model_version))
        published, received, loaded = _sync(backend, engine, backend.model_version)
        after = _sample(engine)
    finally:
        engine.close()
    trainer_after = _split(backend.forward_rows(_rows(after), "policy"), after)
    initial_after = _split(TorchBackend(run_config(family_model)).forward_rows(_rows(after), "policy"), after)
    return Outcome(family_model, before, metrics, published, received, loaded, after, trainer_after, initial_after)


def test_the_engine_samples_every_prompt_to_the_end(outcome: Outcome) -> None:
    for result in outcome.before:
        assert len(result.samples) == 4
        for sample in result.samples:
            assert 0 < len(sample.token_ids) == len(sample.logprobs) <= SAMPLING.max_tokens
            assert sample.finish_reason in ("stop", "length")


def test_the_trainer_trains_on_the_samples_with_log_probs_equal_to_the_engines(outcome: Outcome) -> None:
    metrics = outcome.train_metrics
    assert metrics["model_version"] == 1
    assert metrics["consistency/logprob_diff_max"] <= LOGPROB_TOL
    assert metrics["grad_norm"] > 0


def test_weight_sync_delivers_what_the_trainer_published(outcome: Outcome) -> None:
    assert outcome.loaded_version == 1
    assert outcome.published_digest == outcome.received_digest


def test_the_engine_samples_from_the_trained_weights(outcome: Outcome) -> None:
    """After the sync the engine's log-probs are the trained policy's, and no longer the initial model's."""
    engine = [torch.tensor(s.logprobs) for r in outcome.after for s in r.samples]
    assert all(r.model_version == 1 for r in outcome.after)
    for mine, trained in zip(engine, outcome.trainer_after, strict=True):
        torch.testing.assert_close(mine, trained, rtol=0, atol=LOGPROB_TOL)
    moved = max(float((m - i).abs().max()) for m, i in zip(engine, outcome.initial_after, strict=True))
    assert moved > 100 * LOGPROB_TOL


def test_megatron_scores_the_samples_as_the_trainer_does_or_refuses_the_architecture(outcome: Outcome) -> None:
    from trinity.trainer.megatron import MegatronBackend

    arch = json.loads((outcome.model_dir / "config.json").read_text())["architectures"][0]
    config = run_config(outcome.model_dir, backend="megatron", tensor_parallel_size=1, pipeline_parallel_size=1)
    if arch not in SUPPORTED_ARCHITECTURES:
        with pytest.raises(ValueError, match=f"not {arch}; use trainer.backend: torch"):
            MegatronBackend(config)
        return
    rollouts = _rollouts(outcome.before, 0)
    with MegatronBackend(config) as backend:
        scores = backend.score(rollouts)
    rows = [q for s in to_samples(rollouts, None) for q in s.sequences]  # as the backends collate them
    reference = TorchBackend(run_config(outcome.model_dir)).forward_rows(rows, "policy")
    torch.testing.assert_close(scores, reference, rtol=0, atol=2e-5)
