"""Exported weights carry Hugging Face names; LoRA adapters come out merged."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from trainer_helpers import grpo_parts, random_rollouts, run_config
from transformers import AutoModelForCausalLM

from trinity.trainer.torch_backend import TorchBackend


def test_named_weights_use_the_checkpoint_names(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model), algorithm=grpo_parts())
    names = {n for n, _ in backend.named_weights()}
    on_disk = set(load_file(tiny_model / "model.safetensors"))
    assert names == on_disk


def test_lora_weights_are_merged_and_save_hf_round_trips(tiny_model: Path, tmp_path: Path) -> None:
    config = run_config(tiny_model, kl_coef=0.1, lora_rank=4, optimizer={"lr": 1e-2})
    backend = TorchBackend(config, algorithm=grpo_parts(kl_coef=0.1))
    assert backend.reference is not None  # with LoRA: the policy with adapters disabled
    backend.train_step(random_rollouts(6, seed=1))
    ids = torch.tensor([[5, 17, 99, 3, 42]])
    with torch.no_grad():
        trained = backend.policy(ids).logits
    merged = dict(backend.named_weights())
    assert all("lora" not in n and "base_layer" not in n for n in merged)
    base = load_file(tiny_model / "model.safetensors")
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )

    out = backend.save_hf(tmp_path / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, trained, rtol=1e-5, atol=1e-5)
