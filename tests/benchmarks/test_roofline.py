"""benchmarks/bench_roofline.py's pure parts: FLOP counting of GEMMs and a decoder, and the op-family table."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.bench_roofline import (
    MATMUL_OPS,
    OTHER,
    OUTSIDE_OPS,
    Gemm,
    Operand,
    best_seconds,
    decode_ceiling,
    family_table,
    gemm_flops,
    gemm_peak,
    kernel_floor,
    linear_gemms,
    op_family,
    product_flops,
    record_products,
    replay_products,
    split_flops,
)


def _tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip


def _global_counts(counter: FlopCounterMode) -> dict[str, int]:
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_a_gemm_counts_two_flops_per_multiply_add():
    assert gemm_flops(3, 5, 7) == 2 * 3 * 5 * 7
    assert Gemm("x", 3, 5, 7, count=4).flops == 4 * 210


def test_split_flops_agrees_with_torch_on_a_linear_forward_and_backward():
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(4, 16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.linear(x, w).sum().backward()
    flops = split_flops(_global_counts(counter))
    # forward, grad of the input, grad of the weight: three GEMMs of the same size
    assert flops["matmul / linear"] == 3 * gemm_flops(8, 16, 4)
    assert flops["total"] == flops["matmul / linear"]


def test_linear_gemms_are_the_matmul_flops_of_a_llama_forward():
    config = _tiny_config()
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    tokens = 12
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=torch.randint(0, config.vocab_size, (1, tokens)))
    flops = split_flops(_global_counts(counter))
    assert flops["matmul / linear"] == sum(g.flops for g in linear_gemms(config, tokens))
    assert {g.name for g in linear_gemms(config, tokens)} >= {"q_proj", "down_proj", "lm_head"}


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("aten::addmm", "matmul / linear"),
        ("aten::mm", "matmul / linear"),
        ("aten::add_", "elementwise"),
        ("aten::mul", "elementwise"),
        ("aten::silu_backward", "elementwise"),
        ("aten::_log_softmax_backward_data", "softmax / log-softmax / logprob"),
        ("aten::gather", "softmax / log-softmax / logprob"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention (sdpa)"),
        ("aten::_fused_adamw_", "optimizer"),
        ("aten::_foreach_norm", "optimizer"),
        ("Optimizer.step#AdamW.step", "optimizer"),
        ("aten::_to_copy", "copy / cast / allocation"),
        ("aten::copy_", "copy / cast / allocation"),
        ("aten::embedding_dense_backward", "embedding"),
        ("aten::rsqrt", "norm"),
        ("aten::view", OTHER),
        ("autograd::engine::evaluate_function: MmBackward0", OTHER),
    ],
)
def test_op_family_of_profiler_names(name: str, family: str):
    assert op_family(name) == family


def test_family_table_sums_self_time_by_family_and_keeps_the_rest_of_the_step():
    ops = {"aten::mm": 3.0, "aten::addmm": 1.0, "aten::add_": 0.5, "aten::view": 0.25}
    table = family_table(ops, step_seconds=5.0)
    by_family = {r["family"]: r for r in table}
    assert by_family["matmul / linear"]["seconds"] == 4.0
    assert by_family["matmul / linear"]["share"] == 0.8
    assert by_family["elementwise"]["seconds"] == 0.5
    assert by_family[OTHER]["seconds"] == 0.25
    assert by_family[OUTSIDE_OPS]["seconds"] == 0.25
    assert sum(r["share"] for r in table) == pytest.approx(1.0)
    assert [r["seconds"] for r in table] == sorted((r["seconds"] for r in table), reverse=True)


def test_a_real_train_step_profile_lands_in_the_named_families():
    torch.manual_seed(0)
    model = LlamaForCausalLM(_tiny_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, 96, (2, 10))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        logits = model(input_ids=ids).logits
        loss = -torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).mean()
        loss.backward()
        optimizer.step()
    families = {op_family(e.key) for e in prof.key_averages()}
    assert {"matmul / linear", "softmax / log-softmax / logprob", "embedding", "optimizer", "elementwise"} <= families


def test_best_seconds_warms_up_once_then_times_each_repeat():
    calls = []
    seconds = best_seconds(lambda: calls.append(1), repeats=4, min_sample_s=0.0)
    assert len(calls) == 1 + 4
    assert seconds >= 0.0


def test_gemm_peak_keeps_each_shapes_best_sweep():
    gemms = [Gemm("a", 8, 8, 8), Gemm("b", 16, 16, 16)]
    sweeps = [{"float32": [10.0, 40.0]}, {"float32": [30.0, 20.0]}]
    peak = gemm_peak(gemms, sweeps)["float32"]
    assert [r["gflops"] for r in peak["rows"]] == [30.0, 40.0]
    assert (peak["peak_gflops"], peak["peak_shape"]) == (40.0, "b")
    assert peak["sweep_peaks_gflops"] == [40.0, 30.0]


def test_decode_ceiling_is_the_batch_over_the_step_gemm_time():
    config = _tiny_config()
    gemms = linear_gemms(config, 64)
    ceiling = decode_ceiling(gemms, [100.0] * len(gemms), peak_gflops=200.0)
    seconds = sum(g.flops for g in gemms) / 100e9
    assert ceiling["gemm_seconds_per_step"] == pytest.approx(seconds)
    assert ceiling["tokens_per_s"] == pytest.approx(64 / seconds)
    assert ceiling["tokens_per_s_at_peak"] == pytest.approx(2 * 64 / seconds)


def test_recorded_products_are_every_matmul_of_a_forward_and_backward_with_torchs_flops():
    torch.manual_seed(0)
    model = LlamaForCausalLM(_tiny_config())
    ids = torch.randint(0, 96, (2, 10))

    def step() -> None:
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()

    with FlopCounterMode(display=False) as counter:
        step()
    torch_flops = split_flops(_global_counts(counter))["matmul / linear"]
    counts = record_products(step)
    assert {op for op, _ in counts} <= set(MATMUL_OPS)
    assert sum(product_flops(operands) * n for (_, operands), n in counts.items()) == torch_flops
    # a linear's weight gradient multiplies a transposed operand: the layouts are kept apart
    assert any(o.stride[0] < o.stride[-1] for _, operands in counts for o in operands)


def test_replayed_products_time_each_layout_and_keep_the_count_and_flops():
    a = Operand((8, 16), (16, 1), "float32")
    b_t = Operand((16, 4), (1, 16), "float32")  # a transposed weight, as nn.Linear hands it over
    counts = {("mm", (a, b_t)): 3, ("addmm", (Operand((4,), (1,), "float32"), a, b_t)): 1}
    alone = replay_products(counts, repeats=2)
    assert (alone["products"], alone["distinct"]) == (4, 2)
    assert alone["gflop"] == pytest.approx(4 * 2 * 8 * 16 * 4 / 1e9)
    assert {r["op"]: r["count"] for r in alone["top"]} == {"mm": 3, "addmm": 1}
    assert alone["seconds"] == pytest.approx(sum(r["seconds"] for r in alone["top"])) and alone["seconds"] > 0


def test_kernel_floor_adds_the_attention_and_optimizer_kernels_to_the_matmuls_alone():
    ops = {"aten::_scaled_dot_product_flash_attention_for_cpu": 0.2, "aten::_fused_adamw_": 0.1, "aten::mul": 5.0}
    floor = kernel_floor(1.0, ops)
    assert floor["seconds"] == pytest.approx(1.3)
    assert (floor["attention (sdpa)"], floor["optimizer"]) == (0.2, 0.1)
