"""Tiny random Llama-style models in Hugging Face format, for tests that need only mechanics."""

from __future__ import annotations

from pathlib import Path


def build_tiny_llama(
    path: str | Path,
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
    """Write a random Llama model (config + safetensors + a byte-level tokenizer) to `path`.

    The tokenizer is a real `tokenizers` byte-level BPE with no merges (one token per byte plus
    specials) and a ChatML template, so chat prompts, stop strings and decoding all work.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _byte_tokenizer(vocab_size)
    tokenizer.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",  # transformers 5 name of torch_dtype (the saved config.json is identical)
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
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
