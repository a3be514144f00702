"""A streamed sync loads each verified chunk straight into a real engine; a chunk that fails its checksums tears
the engine, which refuses calls until the next whole version has loaded.

A real gloo group (the trainer's sender on a thread of this process) and the transformers engine on a tiny Llama.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.sync.loopback import loopback_pair
from trinity.explorer.engines.base import GenerationRequest, SamplingSettings, WeightsTorn
from trinity.explorer.engines.hf_engine import TransformersEngine
from trinity.models.digest import weights_digest
from trinity.models.tiny import build_tiny_llama
from trinity.sync import ChecksumMismatch, WeightReceiver, WeightSender, load_streamed

GREEDY = GenerationRequest(prompt="2+3=", n=1, sampling=SamplingSettings(temperature=0.0, max_tokens=6))


def _trained(path: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path)
    return [(n, p.detach() + torch.randn(p.shape, generator=g) * 0.2) for n, p in model.named_parameters()]


@pytest.fixture
def group() -> Iterator[tuple[WeightSender, WeightReceiver]]:
    # ~16 KB chunks: the tiny model's weights arrive in many, so a failure in the second leaves the first loaded.
    sender, receiver = loopback_pair(bucket_mb=1 / 64)
    yield sender, receiver
    receiver.close()
    sender.close()


def _publish(sender: WeightSender, version: int, weights: list[tuple[str, torch.Tensor]]) -> threading.Thread:
    thread = threading.Thread(target=sender.publish, args=(version, weights), daemon=True)
    thread.start()
    return thread


def _stream_into(engine: TransformersEngine, receiver: WeightReceiver) -> int:
    """What the explorer's weight feed does in streamed mode; returns the digest of what the engine loaded."""
    version, named = receiver.receive_streamed(idle_timeout_s=30)
    return load_streamed(version, named, engine.load_weights)


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[tuple[Path, TransformersEngine]]:
    path = build_tiny_llama(tmp_path / "tiny", vocab_size=300)
    engine = TransformersEngine(model_path=str(path))
    yield path, engine
    engine.close()


def test_a_streamed_version_loads_exactly_what_the_trainer_published(
    tiny: tuple[Path, TransformersEngine], group: tuple[WeightSender, WeightReceiver]
) -> None:
    (path, engine), (sender, receiver) = tiny, group
    before = engine.generate([GREEDY])[0].samples[0].token_ids
    weights = _trained(path, seed=1)

    publishing = _publish(sender, 1, weights)
    loaded = _stream_into(engine, receiver)
    publishing.join(30)

    assert engine.model_version == 1 and engine.torn is None
    assert loaded == weights_digest(weights) == receiver.published_digest
    served = dict(engine._model.named_parameters())
    assert all(torch.equal(served[name], tensor) for name, tensor in weights)
    assert engine.generate([GREEDY])[0].samples[0].token_ids != before


def test_a_chunk_that_fails_its_checksums_tears_the_engine_until_a_whole_version_loads(
    tiny: tuple[Path, TransformersEngine], group: tuple[WeightSender, WeightReceiver]
) -> None:
    (path, engine), (sender, receiver) = tiny, group
    first, second = _trained(path, seed=1), _trained(path, seed=2)

    def flip_second_chunk(chunk: int, bucket: int, data: torch.Tensor) -> None:
        if chunk == 1 and bucket == 0:
            data[0] ^= 0xFF

    receiver._bucket_hook = flip_second_chunk
    publishing = _publish(sender, 1, first)
    with pytest.raises(ChecksumMismatch, match="version 1: checksum mismatch in chunk 1 bucket 0"):
        _stream_into(engine, receiver)
    publishing.join(30)

    # The first chunk was verified and loaded, the rest was not: a mix no version describes.
    assert engine.model_version == 0
    assert engine.torn is not None and "weight version 1 failed part-way" in engine.torn
    served = dict(engine._model.named_parameters())
    name, tensor = first[0]
    assert torch.equal(served[name], tensor)
    assert not torch.equal(served[first[-1][0]], first[-1][1])
    with pytest.raises(WeightsTorn, match="serves again once a whole version has loaded"):
        engine.generate([GREEDY])

    receiver._bucket_hook = None
    publishing = _publish(sender, 2, second)
    assert _stream_into(engine, receiver) == weights_digest(second)
    publishing.join(30)
    assert engine.model_version == 2 and engine.torn is None
    assert engine.generate([GREEDY])[0].model_version == 2
