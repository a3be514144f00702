"""The trainer's shared-prompt attention: one masked row against the prompt's keys computed once per group.

    python -m benchmarks.bench_attention_layout [--quick]

The trainer packs a GRPO group into one row, `prompt + response_1 + ... + response_G`, under a block mask in
which each response sees the prompt and itself (trinity.trainer.batch). SDPA then computes the whole
`[row, row]` score matrix and masks much of it: at the quickstart's shapes (a 43-token prompt, 8 responses of
16 tokens) half of the causal triangle (`masked_fraction_of_causal`). Three layouts of the same attention,
forward + backward, fp32 (the trainer's attention dtype on a CPU, trinity.trainer.attention), SmolLM2-135M's
heads (9 query, 3 key/value, 64 wide):

- `masked_repeat_kv`: what the trainer runs, Hugging Face's SDPA path: key/value heads repeated for GQA, the
  `[row, row]` block mask (the baseline);
- `masked_gqa`: the same mask, SDPA's own GQA (`enable_gqa`) instead of the repeated copies;
- `prefix_split`: the prompt attends causally to itself once, and each response attends to
  `[prompt keys, its own keys]`: a `[G x response, prompt + response]` problem with no masked-out response
  pairs (the prefix KV layout).

Every layout's output and q/k/v gradients are checked equal to the baseline's before it is timed. Times are
the best of N on 2 threads, per decoder layer and micro-batch; `step_seconds` scales them to a quickstart step
(every row of a step through every layer). Writes benchmarks/results/attention_layout.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.bench_roofline import THREADS, best_seconds
from benchmarks.common import write_result


@dataclass(frozen=True)
class Shape:
    """A micro-batch of `rows` packed groups; `rows_per_step` and `layers` scale one call to a train step."""

    rows: int = 5  # 1024-token micro-batches of 171-token rows
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    prompt: int = 43
    group: int = 8
    response: int = 16
    rows_per_step: int = 8
    layers: int = 30

    @property
    def seq(self) -> int:
        return self.prompt + self.group * self.response


Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def block_mask(shape: Shape) -> torch.Tensor:
    """`[seq, seq]`, True = may attend: causal, and a response sees the prompt and itself (batch.py's mask)."""
    responses = torch.arange(1, shape.group + 1).repeat_interleave(shape.response)
    segment = torch.cat([torch.zeros(shape.prompt, dtype=torch.long), responses])
    causal = torch.ones(shape.seq, shape.seq, dtype=torch.bool).tril()
    return causal & ((segment[None, :] == 0) | (segment[:, None] == segment[None, :]))


def masked_repeat_kv(shape: Shape) -> Attention:
    mask = block_mask(shape)
    repeats = shape.heads // shape.kv_heads

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(repeats, 1), v.repeat_interleave(repeats, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return attend


def masked_gqa(shape: Shape) -> Attention:
    mask = block_mask(shape)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    return attend


def prefix_split(shape: Shape) -> Attention:
    rows, group, p, r = shape.rows, shape.group, shape.prompt, shape.response
    own = torch.ones(r, p + r, dtype=torch.bool)
    own[:, p:] = torch.ones(r, r, dtype=torch.bool).tril()

    def per_response(t: torch.Tensor) -> torch.Tensor:
        """`[rows, h, G*r, d]` -> `[rows*G, h, r, d]`: each response its own batch entry."""
        h, d = t.shape[1], t.shape[3]
        return t.reshape(rows, h, group, r, d).transpose(1, 2).reshape(rows * group, h, r, d)

    def with_prefix(t: torch.Tensor) -> torch.Tensor:
        """`[rows, h, seq, d]` -> `[rows*G, h, p + r, d]`: the prompt's keys (shared, not recomputed) before each
        response's own."""
        h, d = t.shape[1], t.shape[3]
        prompt = t[:, :, :p].unsqueeze(1).expand(rows, group, h, p, d).reshape(rows * group, h, p, d)
        return torch.cat([prompt, per_response(t[:, :, p:])], 2)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        head = F.scaled_dot_product_attention(q[:, :, :p], k[:, :, :p], v[:, :, :p], is_causal=True, enable_gqa=True)
        tail = F.scaled_dot_product_attention(
            per_response(q[:, :, p:]), with_prefix(k), with_prefix(v), attn_mask=own, enable_gqa=True
        )
        h, d = q.shape[1], q.shape[3]
        tail = tail.reshape(rows, group, h, r, d).transpose(1, 2).reshape(rows, h, group * r, d)
        return torch.cat([head, tail], 2)

    return attend


LAYOUTS: dict[str, Callable[[Shape], Attention]] = {
    "masked_repeat_kv": masked_repeat_kv,
    "masked_gqa": masked_gqa,
    "prefix_split": prefix_split,
}


def inputs(shape: Shape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def leaf(heads: int) -> torch.Tensor:
        return torch.randn(shape.rows, heads, shape.seq, shape.head_dim, generator=g).requires_grad_()

    return leaf(shape.heads), leaf(shape.kv_heads), leaf(shape.kv_heads)


def forward_backward(attend: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    """The output and the q, k, v gradients of a fixed random upstream gradient (one backward, as training)."""
    for t in (q, k, v):
        t.grad = None
    out = attend(q, k, v)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(upstream)
    return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]  # type: ignore[union-attr]


def max_difference(shape: Shape, layout: str) -> float:
    """The largest absolute difference of `layout`'s output and gradients from the baseline's."""
    q, k, v = inputs(shape)
    expected = forward_backward(masked_repeat_kv(shape), q, k, v)
    got = forward_backward(LAYOUTS[layout](shape), q, k, v)
    return max(float((a - b).abs().max()) for a, b in zip(expected, got, strict=True))


def measure(shape: Shape, repeats: int) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    q, k, v = inputs(shape)
    layouts: dict[str, dict[str, float]] = {}
    for name, build in LAYOUTS.items():
        difference = max_difference(shape, name)
        if difference > 1e-4:
            raise AssertionError(f"{name} differs from the masked baseline by {difference:.2e}")
        attend = build(shape)
        seconds = best_seconds(lambda attend=attend: forward_backward(attend, q, k, v), repeats)
        layouts[name] = {"ms_per_layer_microbatch": seconds * 1e3, "max_difference": difference}
    base = layouts["masked_repeat_kv"]["ms_per_layer_microbatch"]
    per_step = shape.layers * shape.rows_per_step / shape.rows
    for row in layouts.values():
        row["step_seconds"] = row["ms_per_layer_microbatch"] / 1e3 * per_step
        row["speedup"] = base / row["ms_per_layer_microbatch"]
    masked = 1 - float(block_mask(shape).sum()) / (shape.seq * (shape.seq + 1) / 2)
    return {"shape": asdict(shape), "threads": THREADS, "masked_fraction_of_causal": masked, "layouts": layouts}


def run(quick: bool = False) -> dict[str, Any]:
    result = measure(Shape(), repeats=3 if quick else 10)
    write_result("attention_layout_quick" if quick else "attention_layout", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    print(json.dumps(run(parser.parse_args().quick), indent=2))
