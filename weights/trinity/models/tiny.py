"""Tiny random models of the supported families in Hugging Face format, for tests that need only mechanics."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_tiny_llama(path: str | Path, **sizes: Any) -> Path:
    """Write a random Llama model (config + safetensors + a byte-level tokenizer) to `path` (`build_tiny_model`)."""
    return build_tiny_model(path, "llama", **sizes)


# The architecture-specific settings of each family's tiny model, beside the sizes every family shares. MoE: 4
# experts, 2 per token, each half the dense MLP's width; Gemma's attention scale is set by its head size as in the
# released checkpoints (which always tie the LM head to the embedding: vLLM's Gemma has no `lm_head` of its own), a
# short sliding window makes the local layers differ from global attention in tests, and Gemma 2's soft caps sit near
# the tiny model's logit and attention-score scale (as 30 and 50 sit near a released model's) so that leaving one
# out shows.
FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "norm_topk_prob": True},
    "gemma2": {
        "sliding_window": 16,
        "tie_word_embeddings": True,
        "final_logit_softcapping": 1.0,
        "attn_logit_softcapping": 1.0,
    },
    "gemma3_text": {"sliding_window": 16, "sliding_window_pattern": 2, "tie_word_embeddings": True},
    "mistral": {},
    "phi3": {},
}
FAMILIES = tuple(FAMILY_SETTINGS)


def build_tiny_model(
    path: str | Path,
    family: str = "llama",
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> Path:
    """Write a random model of `family` (a Hugging Face `model_type` in `FAMILIES`) with a byte-level tokenizer.

    The tokenizer is a real `tokenizers` byte-level BPE with no merges (one token per byte plus
    specials) and a ChatML template, so chat prompts, stop strings and decoding all work.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if family not in FAMILY_SETTINGS:
        raise ValueError(f"unknown model family {family!r}; one of {FAMILIES}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _byte_tokenizer(vocab_size)
    tokenizer.save_pretrained(out)
    head_dim = hidden_size // num_heads
    settings = dict(FAMILY_SETTINGS[family])
    if family == "qwen3_moe":
        settings["moe_intermediate_size"] = intermediate_size // 2
    if family.startswith("gemma"):
        settings["query_pre_attn_scalar"] = head_dim
    shared: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "dtype": "float32",  # transformers 5 name of torch_dtype (the saved config.json is identical)
    }
    config = AutoConfig.for_model(family, **{**shared, **settings})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out, safe_serialization=True)
    return out


CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_vocab = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(_SPECIALS) + len(byte_vocab):
        raise ValueError(f"vocab_size must be at least {len(_SPECIALS) + len(byte_vocab)} for a byte tokenizer")
    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    for ch in sorted(byte_vocab):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok
