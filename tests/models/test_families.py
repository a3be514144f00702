"""Per family, without an engine: the trainer's log-probs, the exported weight names, LoRA targets, Megatron's map.

The tiny models (conftest) have each family's own architecture: Qwen2's q/k/v biases, Qwen3's q/k norms, Qwen3-MoE's
experts (fused into one tensor per layer by transformers), Gemma 2's logit soft-capping and sliding windows, Phi-3's
fused `qkv_proj` and `gate_up_proj`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file

from trinity.config import TorchTrainerConfig
from trinity.trainer.batch import TokenSequence, collate
from trinity.trainer.megatron.hf_mapping import hf_to_megatron, megatron_to_hf, shape_from_hf_config, stage_layers
from trinity.trainer.models import TokenLogprobs, apply_lora, load_causal_lm, lora_targets
from trinity.trainer.weights import named_weights

MEGATRON_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
PROMPTS = ([5, 40, 41, 42, 43, 44, 45, 46], [5, 60, 61])
RESPONSES = (list(range(70, 91)), [100, 101, 102])


def _checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def _lora_model(model_dir: Path) -> torch.nn.Module:
    return apply_lora(load_causal_lm(model_dir), TorchTrainerConfig(lora_rank=4))


def _reference_logprobs(model_dir: Path, temperature: float) -> list[torch.Tensor]:
    """Log-probs of RESPONSES from the model's own forward with eager attention (transformers' reference
    implementation of each architecture)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
            logits = lm(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0])
    return out


def _trainer_logprobs(model_dir: Path, temperature: float) -> torch.Tensor:
    lm = load_causal_lm(model_dir).eval()
    seqs = [
        TokenSequence(prompt=p, response=r, action_mask=[True] * len(r))
        for p, r in zip(PROMPTS, RESPONSES, strict=True)
    ]
    with torch.no_grad():
        return TokenLogprobs(lm, chunk_size=7, temperature=temperature)(collate(seqs, pad_id=2))[0]


def test_trainer_logprobs_equal_the_models_own_forward(family_model: Path) -> None:
    """The trainer runs the decoder and the LM head itself; whatever the model's forward does after its head
    (Gemma 2's soft-capping) must happen here too. The sequences outrun Gemma's 16-token sliding window."""
    mine = _trainer_logprobs(family_model, 0.7)
    for row, expected in enumerate(_reference_logprobs(family_model, 0.7)):
        torch.testing.assert_close(mine[row, : len(expected)], expected, rtol=0, atol=1e-5)


def test_the_trainer_soft_caps_attention_scores_where_the_model_does(tmp_path: Path) -> None:
    """transformers' default attention (SDPA) would leave Gemma 2's `attn_logit_softcapping` out; a cap below the
    tiny model's scores makes that visible."""
    from trinity.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "gemma2", "gemma2", vocab_size=320, hidden_size=128, num_heads=2)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "attn_logit_softcapping": 0.05}))
    mine = _trainer_logprobs(model_dir, 1.0)
    for row, expected in enumerate(_reference_logprobs(model_dir, 1.0)):
        torch.testing.assert_close(mine[row, : len(expected)], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_shared_prompt_rows_keep_the_sliding_window(tmp_path: Path, family: str) -> None:
    """A GRPO group shares its prompt in one row under a block mask, which transformers takes as given: the window
    must be in it. Gemma 2 windows half its layers (`layer_types`), Mistral all of them (here 16 tokens, below
    these 60-token sequences)."""
    from trinity.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / family, family, vocab_size=320, hidden_size=128, num_heads=2)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "sliding_window": 16}))
    policy = TokenLogprobs(load_causal_lm(model_dir).eval(), chunk_size=64, temperature=1.0)
    prompt = list(range(40, 80))
    seqs = [
        TokenSequence(prompt=prompt, response=list(range(100 + i, 120 + i)), action_mask=[True] * 20) for i in range(4)
    ]
    with torch.no_grad():
        shared, plain = policy(collate(seqs, 2, pack_budget=1024))[0], policy(collate(seqs, 2))[0]
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)


def test_exported_weights_are_the_checkpoints_tensors_under_its_names(family_model: Path) -> None:
    """What weight sync sends is what a checkpoint holds (vLLM and the digest read checkpoint names), also where
    transformers holds the weights in another layout (an MoE's experts in one tensor per layer)."""
    exported = dict(named_weights(load_causal_lm(family_model)))
    checkpoint = _checkpoint(family_model)
    assert exported.keys() == checkpoint.keys()
    assert all(torch.equal(exported[name], tensor) for name, tensor in checkpoint.items())


def test_default_lora_targets_adapt_every_attention_projection(family_model: Path) -> None:
    model = _lora_model(family_model)
    attention = {n: m for n, m in model.named_modules() if ".self_attn." in n and n.endswith("_proj")}
    assert attention
    assert all(isinstance(module, LoraLayer) for module in attention.values()), sorted(attention)


def test_lora_merged_export_keeps_the_checkpoint_names_and_moves_the_adapted_weights(family_model: Path) -> None:
    model = _lora_model(family_model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)  # peft starts B at zero: a trained adapter changes its weight
    exported = dict(named_weights(model))
    checkpoint = _checkpoint(family_model)
    assert exported.keys() == checkpoint.keys()
    moved = {n for n, t in checkpoint.items() if not torch.equal(exported[n], t)}
    assert moved and all(".self_attn." in n or ".mlp." in n for n in moved)


def test_a_part_of_a_fused_projection_adapts_the_fused_module(tmp_path: Path) -> None:
    from trinity.models.tiny import build_tiny_model

    phi3 = load_causal_lm(build_tiny_model(tmp_path / "phi3", "phi3", vocab_size=260))
    assert lora_targets(phi3, ["q_proj", "up_proj", "o_proj"]) == ["o_proj", "qkv_proj", "gate_up_proj"]


def test_lora_targets_that_match_no_module_are_refused_naming_the_models_linears(family_model: Path) -> None:
    lm = load_causal_lm(family_model)
    with pytest.raises(ValueError, match=r"trainer.lora_target_modules: none of \['attn'\].*o_proj"):
        lora_targets(lm, ["attn"])


def test_megatron_maps_its_architectures_bit_exactly_and_refuses_the_others(family_model: Path) -> None:
    config = json.loads((family_model / "config.json").read_text())
    arch = config["architectures"][0]
    if arch not in MEGATRON_ARCHITECTURES:
        with pytest.raises(ValueError, match=f"not {arch}; use trainer.backend: torch"):
            shape_from_hf_config(config)
        return
    shape = shape_from_hf_config(config)
    hf = _checkpoint(family_model)
    pp = 2
    back: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        shards = hf_to_megatron(hf.__getitem__, shape, 1, 0, pp, stage)
        for name, tensor in shards.items():
            back.update(megatron_to_hf(name, [tensor], shape, stage_layers(shape, pp, stage)[0]))
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[n], t) for n, t in hf.items())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sliding_window": 4096, "max_position_embeddings": 32768}, "sliding-window attention"),  # Mistral-7B-v0.1
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_megatron_refuses_what_its_layers_do_not_compute(overrides: dict[str, object], message: str) -> None:
    config = {
        "architectures": ["MistralForCausalLM"], "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 320, "max_position_embeddings": 512,
        "sliding_window": None,
    }  # fmt: skip
    shape_from_hf_config(config)  # accepted as it is
    with pytest.raises(ValueError, match=message):
        shape_from_hf_config({**config, **overrides})
