"""The attention layouts bench_attention_layout times compute the trainer's masked attention exactly."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_attention_layout as bench

SMALL = bench.Shape(rows=2, heads=4, kv_heads=2, head_dim=8, prompt=5, group=3, response=4, rows_per_step=2, layers=1)


def test_the_mask_lets_a_response_see_the_prompt_and_itself_only():
    mask = bench.block_mask(SMALL)
    first, second = SMALL.prompt, SMALL.prompt + SMALL.response  # the first token of responses 1 and 2
    assert mask[second, : SMALL.prompt].all()  # the whole prompt
    assert not mask[second, first : first + SMALL.response].any()  # not another response
    assert mask[second + 2, second : second + 3].all() and not mask[second + 2, second + 3]  # itself, causally
    assert not mask[0, 1:].any()  # the prompt is causal


@pytest.mark.parametrize("layout", sorted(bench.LAYOUTS))
def test_every_layout_gives_the_baseline_output_and_gradients(layout):
    assert bench.max_difference(SMALL, layout) < 1e-5


def test_a_layout_that_attends_differently_is_refused_before_it_is_timed(monkeypatch):
    def unmasked(shape: bench.Shape) -> bench.Attention:
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        return attend

    monkeypatch.setitem(bench.LAYOUTS, "unmasked", unmasked)
    with pytest.raises(AssertionError, match="unmasked differs"):
        bench.measure(SMALL, repeats=1)
