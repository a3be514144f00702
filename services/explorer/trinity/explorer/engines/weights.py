"""Regroup a stream of Hugging-Face-named tensors into whole-module chunks for in-place reloads.

vLLM fuses checkpoint tensors (q/k/v -> `qkv_proj`, gate/up -> `gate_up_proj`) and its in-place
reload processes a fused module once per call with whatever parts arrived: feeding `q_proj` in one
call and `k_proj` in the next silently leaves garbage in the other parts (measured, see
docs/explorer.md). So tensors are buffered until every checkpoint tensor of their decoder layer (or
top-level module) has arrived, and only complete groups are emitted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from trinity.explorer.engines.base import LoadRefused

_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")

NamedTensors = list[tuple[str, torch.Tensor]]


def group_key(name: str) -> str:
    """The unit that must be loaded together: a decoder layer, else the tensor's parent module."""
    m = _LAYER.match(name)
    if m:
        return m.group(1)
    return name.rsplit(".", 1)[0] if "." in name else name


def checkpoint_tensor_names(model_dir: str | Path) -> list[str]:
    """Tensor names stored in a Hugging Face checkpoint directory (reads headers only)."""
    from safetensors import safe_open

    names: list[str] = []
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def complete_groups(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    expected_names: Iterable[str],
    bucket_bytes: int = 1 << 30,
) -> Iterator[NamedTensors]:
    """Yield buckets of complete groups (about `bucket_bytes` each) in arrival order.

    A tensor whose group is unknown to the checkpoint (e.g. a tied `lm_head.weight`) forms its own
    group. Raises `ValueError` at the end if a known group arrived only in part, naming the missing
    tensors, because loading it would corrupt the model.
    """
    expected: dict[str, set[str]] = {}
    for name in expected_names:
        expected.setdefault(group_key(name), set()).add(name)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    bucket: NamedTensors = []
    size = 0
    emitted = False
    for name, tensor in named_tensors:
        key = group_key(name)
        parts = pending.setdefault(key, {})
        parts[name] = tensor
        if key in expected and not expected[key] <= parts.keys():
            continue
        del pending[key]
        bucket.extend(parts.items())
        size += sum(t.numel() * t.element_size() for t in parts.values())
        if size >= bucket_bytes:
            yield bucket
            bucket, size, emitted = [], 0, True
    if bucket:
        yield bucket
        emitted = True
    if pending:
        missing = sorted(n for key, parts in pending.items() for n in expected[key] - parts.keys())
        # Nothing emitted: nothing was loaded, so the model is unchanged (a refusal, not a torn engine).
        raise (ValueError if emitted else LoadRefused)(
            f"partial weight update: {len(missing)} tensors missing from incomplete layers "
            f"(e.g. {missing[:4]}); send whole decoder layers, vLLM would load the rest as garbage"
        )
