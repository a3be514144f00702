"""Received weights, handed over layer by layer, reproduce the sender's model exactly in a real HF model."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tests.sync.loopback import loopback_pair
from trinity.models.tiny import build_tiny_llama
from trinity.sync.protocol import layer_key


def test_layer_by_layer_load_reproduces_the_trainer_model(tmp_path: Path) -> None:
    path = build_tiny_llama(tmp_path / "tiny", vocab_size=300, num_layers=3)
    trainer_model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for parameter in trainer_model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)  # a "trained" model that differs from disk
    explorer_model = AutoModelForCausalLM.from_pretrained(path)

    sender, receiver = loopback_pair()
    publishing = threading.Thread(target=sender.publish, args=(4, list(trainer_model.named_parameters())))
    publishing.start()

    calls: list[list[str]] = []

    def load(version: int, named: list[tuple[str, torch.Tensor]]) -> None:
        assert version == 4
        calls.append([n for n, _ in named])
        explorer_model.load_state_dict(dict(named), strict=False)

    assert receiver.receive_into(load) == 4
    publishing.join()
    sender.close()
    receiver.close()

    assert all(len({layer_key(n) for n in names}) == 1 for names in calls)  # no call mixes two layers
    assert len(calls) == 3 + 2  # 3 decoder layers + embed_tokens + final norm (lm_head is tied)
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    with torch.no_grad():
        assert torch.equal(explorer_model(ids).logits, trainer_model(ids).logits)
