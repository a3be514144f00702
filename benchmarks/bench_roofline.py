"""Roofline of a quickstart step: how far the train step and vLLM's decode are from this machine's matmul limit.

    python -m benchmarks.bench_roofline            # full: more GEMM sizes and repeats (a few minutes)
    python -m benchmarks.bench_roofline --quick    # fewer sizes and repeats, the same real model and batch

Every figure comes from one run, on 2 torch threads (the machine's 2 cores), SmolLM2-135M-Instruct:

1. peak GEMM GFLOP/s per dtype (fp32, bf16): `torch.matmul` of square sizes and of the model's own linear
   shapes (a train micro-batch's tokens and a decode step's sequences), best of N after a warm-up, in two sweeps,
   before and after the train steps, each shape keeping its best;
2. one GRPO train step of the quickstart batch (examples/quickstart/config.yaml: 8 prompts x 8 responses of
   16 tokens, chat-templated quickstart questions) through `TorchBackend`, fp32 and bf16 autocast: its matmul
   FLOPs (`FlopCounterMode`, forward + backward), its time, achieved FLOP/s and the fraction of the peak;
3. where that step goes: `torch.profiler` self CPU time by operation family, and the top 10 ops; every matrix
   product of one more step recorded (op, operand shapes and strides) and each timed alone on the same layout:
   the step's matmuls at the kernels' best, and with its attention kernels and optimizer the step's kernel floor;
4. vLLM decode (the explorer's engine) of the same batch, 64 sequences, fp32 and bf16: decode tokens/s
   against a ceiling at the same batch, 64 / (one decode step's linear-layer and LM-head GEMMs at M=64,
   timed with torch.matmul): the tokens/s if only the matmuls ran; and against the same GEMMs at the peak rate.

The measurement runs in a fresh child process: an in-process vLLM engine binds the OpenMP threads and replaces
`torch.set_num_threads` with a no-op for the rest of the process, so neither an earlier benchmark of
`python -m benchmarks` nor this one's own engines may run before the torch measurements.
Writes benchmarks/results/roofline.json (`roofline_quick.json` with --quick).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import run_child, write_result

QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart"
THREADS = 2
DTYPES = ("float32", "bfloat16")


# ---- pure helpers: FLOPs, shapes, op families -----------------------------------------------------------------


@dataclass(frozen=True)
class Gemm:
    """`count` products of an `[m, k]` by `[k, n]` matrix (a linear layer over `m` tokens: in `k`, out `n`)."""

    name: str
    m: int
    k: int
    n: int
    count: int = 1

    @property
    def flops(self) -> int:
        return gemm_flops(self.m, self.k, self.n) * self.count


def gemm_flops(m: int, k: int, n: int) -> int:
    """Multiply-adds count two FLOPs each."""
    return 2 * m * k * n


def linear_gemms(config: Any, tokens: int) -> list[Gemm]:
    """The forward GEMMs of a Llama-style decoder (HF config fields) over `tokens` tokens, the LM head included."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    inter = int(config.intermediate_size)
    layers = int(config.num_hidden_layers)
    return [
        Gemm("q_proj", tokens, hidden, heads * head_dim, layers),
        Gemm("k_proj", tokens, hidden, kv_heads * head_dim, layers),
        Gemm("v_proj", tokens, hidden, kv_heads * head_dim, layers),
        Gemm("o_proj", tokens, heads * head_dim, hidden, layers),
        Gemm("gate_proj", tokens, hidden, inter, layers),
        Gemm("up_proj", tokens, hidden, inter, layers),
        Gemm("down_proj", tokens, inter, hidden, layers),
        Gemm("lm_head", tokens, hidden, int(config.vocab_size)),
    ]


# An aten op (`aten::` stripped, leading underscores too) is in the first family with a key equal to its name or
# a prefix of it followed by `_` (`add` covers `add_`, not `addmm`); a key ending in `_` is a plain prefix.
OP_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul / linear", ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "mkldnn_")),
    ("attention (sdpa)", ("scaled_dot_product_", "flash_attention", "efficient_attention")),
    ("softmax / log-softmax / logprob", ("log_softmax", "softmax", "logsumexp", "gather", "scatter", "scatter_add",
                                         "nll_loss", "nll_loss_forward", "nll_loss2d")),
    ("norm", ("rms_norm", "fused_rms_norm", "native_layer_norm", "layer_norm", "rsqrt")),
    ("embedding", ("embedding", "embedding_dense_backward")),
    ("optimizer", ("fused_adamw", "fused_adam", "foreach_", "linalg_vector_norm")),
    ("copy / cast / allocation", ("copy", "to", "to_copy", "clone", "contiguous", "cat", "stack", "empty",
                                  "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
                                  "fill", "zero", "new_", "resize", "index_put", "index_select", "split",
                                  "split_with_sizes", "constant_pad_nd", "pad")),
    ("elementwise", ("add", "sub", "rsub", "mul", "div", "neg", "exp", "log", "pow", "sqrt", "silu", "sigmoid",
                     "tanh", "where", "clamp", "clamp_min", "clamp_max", "abs", "sum", "mean", "max", "min", "amax",
                     "masked_fill", "eq", "ne", "lt", "gt", "le", "ge", "cos", "sin", "threshold", "reciprocal",
                     "square", "minimum", "maximum", "prod", "addcmul", "addcdiv", "lerp", "sign", "logical_and",
                     "logical_not", "bitwise_and", "bitwise_or", "isfinite", "isnan", "exp2", "log1p", "expm1")),
)  # fmt: skip
OTHER = "other"
OUTSIDE_OPS = "outside any op (Python, autograd engine, data prep)"


def op_family(name: str) -> str:
    """The family of an op as the profiler names it: `aten::addmm`, `aten::_log_softmax_backward_data`, or a
    label such as `Optimizer.step#AdamW.step` (the optimizer's) or `autograd::engine::...` (other)."""
    if not name.startswith("aten::"):
        return "optimizer" if name.lower().startswith("optimizer.") else OTHER
    bare = name.removeprefix("aten::").lstrip("_")
    for family, keys in OP_FAMILIES:
        for key in keys:
            if bare == key or bare.startswith(key if key.endswith("_") else key + "_"):
                return family
    return OTHER


def family_table(op_seconds: Mapping[str, float], step_seconds: float) -> list[dict[str, Any]]:
    """Self time per op family, largest first, plus what no op accounts for; shares are of `step_seconds`."""
    totals: dict[str, float] = {}
    for name, seconds in op_seconds.items():
        family = op_family(name)
        totals[family] = totals.get(family, 0.0) + seconds
    totals[OUTSIDE_OPS] = max(0.0, step_seconds - sum(op_seconds.values()))
    rows = [{"family": f, "seconds": s, "share": s / step_seconds if step_seconds else 0.0} for f, s in totals.items()]
    return sorted(rows, key=lambda r: -r["seconds"])


def split_flops(counts: Mapping[str, int]) -> dict[str, int]:
    """FLOPs by family (`FlopCounterMode`'s global counts, keyed by op name) and their total."""
    out: dict[str, int] = {}
    for name, flops in counts.items():
        family = op_family("aten::" + name.removeprefix("aten."))
        out[family] = out.get(family, 0) + int(flops)
    out["total"] = sum(int(f) for f in counts.values())
    return out


def best_seconds(fn: Callable[[], object], repeats: int, min_sample_s: float = 0.02) -> float:
    """Best time of one `fn()` over `repeats` samples, each long enough to read on a timer (after a warm-up)."""
    start = time.perf_counter()
    fn()  # warm-up: allocator, oneDNN kernel selection and weight packing
    once = max(time.perf_counter() - start, 1e-6)
    inner = max(1, math.ceil(min_sample_s / once))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


@dataclass(frozen=True)
class Operand:
    """A matrix product's operand as the op received it: its layout decides which kernel runs and how fast."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str


MATMUL_OPS = ("mm", "addmm", "bmm")  # every matrix product of a decoder step dispatches to one of these (CPU)


def product_flops(operands: tuple[Operand, ...]) -> int:
    """FLOPs of `mm(a, b)`, `addmm(bias, a, b)` or `bmm(a, b)`: the last two operands are the factors."""
    a, b = operands[-2].shape, operands[-1].shape
    return gemm_flops(math.prod(a[:-1]), a[-1], b[-1])  # a batch of `bmm` counts as more rows


def record_products(fn: Callable[[], object]) -> dict[tuple[str, tuple[Operand, ...]], int]:
    """Run `fn` and count every matrix product it dispatches, forward and backward, by op and operand layout."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = {getattr(torch.ops.aten, name).default: name for name in MATMUL_OPS}
    counts: dict[tuple[str, tuple[Operand, ...]], int] = {}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in ops:
                operands = tuple(
                    Operand(tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
                    for a in args
                    if isinstance(a, torch.Tensor)
                )
                counts[(ops[func], operands)] = counts.get((ops[func], operands), 0) + 1
            return func(*args, **(kwargs or {}))

    with Recorder():
        fn()
    return counts


def replay_products(counts: Mapping[tuple[str, tuple[Operand, ...]], int], repeats: int) -> dict[str, Any]:
    """Each recorded product timed alone on fresh operands of the same layout (best of `repeats`), times its count:
    what the step's matmuls cost when nothing else runs, the kernels' own best at these shapes."""
    import torch

    rows: list[dict[str, Any]] = []
    for (op, operands), count in counts.items():
        tensors = [
            torch.empty_strided(o.shape, o.stride, dtype=getattr(torch, o.dtype)).normal_(std=0.02) for o in operands
        ]
        fn = getattr(torch.ops.aten, op).default
        with torch.no_grad():
            seconds = best_seconds(functools.partial(fn, *tensors), repeats)
        flops = product_flops(operands)
        rows.append(
            {
                "op": op,
                "operands": [[list(o.shape), list(o.stride), o.dtype] for o in operands],
                "count": count,
                "seconds": seconds * count,
                "gflops": flops / seconds / 1e9,
                "flops": flops * count,
            }
        )
    rows.sort(key=lambda r: -r["seconds"])
    seconds = sum(r["seconds"] for r in rows)
    flops = sum(r["flops"] for r in rows)
    return {
        "products": sum(counts.values()),
        "distinct": len(rows),
        "seconds": seconds,
        "gflop": flops / 1e9,
        "gflops": flops / seconds / 1e9 if seconds else 0.0,
        "top": rows[:12],
    }


# ---- measurements (the child process) -------------------------------------------------------------------------


def _gemm_seconds(gemm: Gemm, dtype: str, repeats: int) -> float:
    """Seconds of one `[m, k] @ [n, k].T` product, the layout of `nn.Linear` (weights stored `[out, in]`)."""
    import torch

    dt = getattr(torch, dtype)
    x = torch.randn(gemm.m, gemm.k, dtype=dt)
    w = torch.randn(gemm.n, gemm.k, dtype=dt)
    with torch.no_grad():
        return best_seconds(lambda: torch.matmul(x, w.t()), repeats)


def _gemm_sweep(gemms: Iterable[Gemm], repeats: int) -> dict[str, list[float]]:
    """GFLOP/s of each GEMM, per dtype."""
    shapes = list(gemms)
    return {d: [gemm_flops(g.m, g.k, g.n) / _gemm_seconds(g, d, repeats) / 1e9 for g in shapes] for d in DTYPES}


def gemm_peak(gemms: list[Gemm], sweeps: list[dict[str, list[float]]]) -> dict[str, Any]:
    """Per dtype: each shape's best GFLOP/s over the sweeps, the peak (the best of all) and each sweep's own peak.

    Sweeps taken minutes apart let a shared machine's quiet moments set the peak; far-apart sweep peaks show noise.
    """
    out: dict[str, Any] = {}
    for dtype in sweeps[0]:
        rows: list[dict[str, Any]] = [
            {"shape": g.name, "m": g.m, "k": g.k, "n": g.n, "gflops": max(s[dtype][i] for s in sweeps)}
            for i, g in enumerate(gemms)
        ]
        best = max(rows, key=lambda r: r["gflops"])
        out[dtype] = {
            "peak_gflops": best["gflops"],
            "peak_shape": best["shape"],
            "sweep_peaks_gflops": [max(s[dtype]) for s in sweeps],
            "rows": rows,
        }
    return out


def quickstart_config(model_path: str, autocast: bool) -> Any:
    from trinity.config import RunConfig
    from trinity.config.run import load_config_yaml

    data = load_config_yaml((QUICKSTART / "config.yaml").read_text(), "examples/quickstart/config.yaml")
    data["model"]["path"] = model_path
    data["trainer"]["autocast"] = "bfloat16" if autocast else "none"
    data["trainer"]["save_interval"] = 0
    data["monitor"] = {}
    return RunConfig.model_validate(data)


def prompt_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """The explorer's prompt tokens (`Engine.encode_prompt` of a one-message chat)."""
    out = []
    for q in texts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


def questions(n: int) -> list[str]:
    rows = [json.loads(line) for line in (QUICKSTART / "train.jsonl").read_text().splitlines() if line.strip()]
    return [r["question"] for r in rows[:n]]


def train_batch(prompts: list[list[int]], group: int, resp_len: int, vocab: int, step: int, version: int) -> list[Any]:
    """A quickstart train batch: every prompt `group` times, full-length random responses, mixed rewards."""
    import torch

    from trinity.v1 import common_pb2

    g = torch.Generator().manual_seed(step)
    return [
        common_pb2.Experience(
            id=f"s{step}-p{p}-{k}",
            kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
            group_id=f"s{step}-p{p}",
            prompt_token_ids=prompt,
            response_token_ids=torch.randint(10, vocab, (resp_len,), generator=g).tolist(),
            logprobs=[-2.0] * resp_len,
            reward=float((p + k) % 2),  # every group mixed, so every advantage is nonzero
            model_version=version,
        )
        for p, prompt in enumerate(prompts)
        for k in range(group)
    ]


def quickstart_stepper(backend: Any, config: Any) -> Callable[[], tuple[float, dict[str, float]]]:
    """A function that trains `backend` one step on a fresh quickstart batch: (seconds, the step's metrics)."""
    prompts = prompt_ids(backend.hf_tokenizer, questions(config.buffer.batch_size))
    vocab = int(backend.hf_tokenizer.vocab_size)

    def step() -> tuple[float, dict[str, float]]:
        group, length = config.algorithm.group_size, config.model.max_response_tokens
        batch = train_batch(prompts, group, length, vocab, backend.step, backend.model_version)
        start = time.perf_counter()
        metrics = backend.train_step(batch)
        return time.perf_counter() - start, metrics

    return step


def _train_step(model_path: str, dtype: str, repeats: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    from trinity.trainer.torch_backend import TorchBackend

    config = quickstart_config(model_path, autocast=dtype == "bfloat16")
    backend = TorchBackend(config)
    step = quickstart_stepper(backend, config)
    step()  # warm-up; it also runs fewer matrix products than the steps after it, so the FLOPs are the second's
    with FlopCounterMode(display=False) as counter:
        step()
    flops = split_flops({str(op): n for op, n in counter.get_flop_counts()["Global"].items()})
    times = [step()[0] for _ in range(repeats)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled_seconds, metrics = step()
    events = prof.key_averages()
    op_seconds = {e.key: e.self_cpu_time_total / 1e6 for e in events}
    alone = replay_products(record_products(step), repeats=5)
    seconds = min(times)
    matmul_flops = flops.get("matmul / linear", 0)
    matmul_op_seconds = sum(s for n, s in op_seconds.items() if op_family(n) == "matmul / linear")
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]
    return {
        "autocast": dtype == "bfloat16",
        "experiences": config.buffer.batch_size * config.algorithm.group_size,
        "sequence_tokens": metrics["tokens"],  # prompt + response of every experience, as the backend counts
        "step_seconds": seconds,
        "step_seconds_all": times,
        "flops": flops,
        "matmul_gflops_per_step": matmul_flops / 1e9,
        "achieved_matmul_gflops": matmul_flops / seconds / 1e9,
        "matmul_ops_seconds": matmul_op_seconds,
        "matmul_kernel_gflops": matmul_flops / matmul_op_seconds / 1e9 if matmul_op_seconds else None,
        "profiled_step_seconds": profiled_seconds,
        "profile": family_table(op_seconds, profiled_seconds),
        "matmuls_alone": alone,
        "kernel_floor": kernel_floor(alone["seconds"], op_seconds),
        "top_ops": [
            {
                "op": e.key,
                "calls": e.count,
                "self_seconds": e.self_cpu_time_total / 1e6,
                "share": e.self_cpu_time_total / 1e6 / profiled_seconds,
            }
            for e in top
        ],
        "torch_threads": torch.get_num_threads(),
    }


FLOOR_FAMILIES = ("attention (sdpa)", "optimizer")


def kernel_floor(matmuls_alone_seconds: float, op_seconds: Mapping[str, float]) -> dict[str, float]:
    """The least a step of these shapes can take with today's kernels: its matmuls at their best alone, plus the
    self time its attention kernels and optimizer took in the profiled step; every other op (elementwise, casts,
    copies, the log-softmax) and all Python counted as free."""
    parts = {"matmuls_alone": matmuls_alone_seconds}
    for family in FLOOR_FAMILIES:
        parts[family] = sum(s for name, s in op_seconds.items() if op_family(name) == family)
    return {**parts, "seconds": sum(parts.values())}


def decode_ceiling(gemms: list[Gemm], gflops: list[float], peak_gflops: float) -> dict[str, Any]:
    """Tokens/s of one decode step over `m` sequences (the GEMMs' M) if only its linear layers and LM head ran:
    at the rate each GEMM shape was measured at (`gflops`, one per gemm), and at the dtype's peak GEMM rate."""
    batch = gemms[0].m
    seconds = sum(g.flops / (rate * 1e9) for g, rate in zip(gemms, gflops, strict=True))
    flops = sum(g.flops for g in gemms)
    return {
        "gemm_seconds_per_step": seconds,
        "tokens_per_s": batch / seconds,
        "gflops": flops / seconds / 1e9,
        "tokens_per_s_at_peak": batch / (flops / (peak_gflops * 1e9)),
    }


def _vllm_decode(model_path: str, dtype: str, prompts: list[list[int]], group: int, tokens: int, repeats: int) -> dict:
    """Decode tokens/s: (a full-length batch) - (the same batch to one token) leaves `tokens - 1` decode steps.

    The same one-token batch with one sample per prompt tells whether a group's prompt is prefilled once or
    `group` times (the prefix cache shares only whole KV blocks, 128 tokens on the CPU build).
    """
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from trinity.explorer.engines.vllm_engine import VllmEngine

    engine = VllmEngine(model_path=model_path, dtype=dtype, seed=0, max_model_len=512)
    try:
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        def generate(max_tokens: int, n: int = group) -> float:
            params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
            start = time.perf_counter()
            out = engine._llm.generate(inputs, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            assert all(len(c.token_ids) == max_tokens for o in out for c in o.outputs)
            return seconds

        generate(2)  # warm-up (first-call compilation, prefix cache)
        first, full, single = [], [], []
        for _ in range(repeats):
            first.append(generate(1))
            full.append(generate(tokens))
            single.append(generate(1, n=1))
        sequences = len(prompts) * group
        decode_seconds = min(full) - min(first)
        return {
            "sequences": sequences,
            "tokens_per_sequence": tokens,
            "batch_seconds": min(full),
            "prefill_and_first_token_seconds": min(first),
            "prefill_and_first_token_seconds_one_sample_per_prompt": min(single),
            "decode_seconds": decode_seconds,
            "decode_tokens_per_s": sequences * (tokens - 1) / decode_seconds,
            "batch_tokens_per_s": sequences * tokens / min(full),
            "torch_threads": torch.get_num_threads(),
        }
    finally:
        engine.close()


def measure(quick: bool) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig

    from trinity.models import resolve_model_path

    torch.set_num_threads(THREADS)
    model_path = resolve_model_path("smollm2")
    model_config = AutoConfig.from_pretrained(model_path)
    repeats = 3 if quick else 7
    squares = (512, 1024, 2048) if quick else (512, 1024, 2048, 3072, 4096)
    train_config = quickstart_config(model_path, autocast=False)
    tokens = train_config.trainer.micro_batch_tokens  # the most a train micro-batch holds
    group = train_config.algorithm.group_size
    sequences = train_config.buffer.batch_size * group  # one decode step of the whole batch
    decode_gemms = linear_gemms(model_config, sequences)
    gemms = [Gemm(f"square {s}", s, s, s) for s in squares]
    gemms += [Gemm(f"{g.name} M={g.m}", g.m, g.k, g.n) for g in linear_gemms(model_config, tokens) + decode_gemms]
    started = time.perf_counter()
    # Every torch measurement comes before the first engine: vLLM binds the threads and disables
    # torch.set_num_threads for the rest of the process.
    sweeps = [_gemm_sweep(gemms, repeats)]
    train = {}
    for d in DTYPES:
        train[d] = _train_step(model_path, d, 2 if quick else 3)
        gc.collect()  # the backend of one dtype is freed before the next loads
    sweeps.append(_gemm_sweep(gemms, repeats))
    peak = gemm_peak(gemms, sweeps)
    for d, step in train.items():
        step["fraction_of_peak"] = step["achieved_matmul_gflops"] / peak[d]["peak_gflops"]
        kernel = step["matmul_kernel_gflops"]
        step["matmul_kernel_fraction_of_peak"] = kernel / peak[d]["peak_gflops"] if kernel else None
        alone = step["matmuls_alone"]
        alone["fraction_of_peak"] = alone["gflops"] / peak[d]["peak_gflops"]
        floor = step["kernel_floor"]
        floor["fraction_of_peak"] = alone["gflop"] / floor["seconds"] / peak[d]["peak_gflops"]

    from transformers import AutoTokenizer

    prompts = prompt_ids(AutoTokenizer.from_pretrained(model_path), questions(train_config.buffer.batch_size))
    rates = {d: [r["gflops"] for r in peak[d]["rows"][-len(decode_gemms) :]] for d in DTYPES}
    ceiling = {d: decode_ceiling(decode_gemms, rates[d], peak[d]["peak_gflops"]) for d in DTYPES}
    decode = {}
    for d in DTYPES:
        got = _vllm_decode(model_path, d, prompts, group, train_config.model.max_response_tokens, 1 if quick else 3)
        got["ceiling"] = ceiling[d]
        got["fraction_of_ceiling"] = got["decode_tokens_per_s"] / ceiling[d]["tokens_per_s"]
        got["fraction_of_peak_ceiling"] = got["decode_tokens_per_s"] / ceiling[d]["tokens_per_s_at_peak"]
        decode[d] = got
    return {
        "quick": quick,
        "model": "SmolLM2-135M-Instruct",
        "cpu": _cpu(),
        "threads": THREADS,
        "batch": {
            "prompts": len(prompts),
            "group": group,
            "prompt_tokens": [len(p) for p in prompts],
            "response_tokens": train_config.model.max_response_tokens,
            "micro_batch_tokens": tokens,
        },
        "gemm_peak": peak,
        "train_step": train,
        "decode": decode,
        "seconds": time.perf_counter() - started,
    }


def _cpu() -> dict[str, Any]:
    """The CPU model and the matrix extensions that decide the bf16 peak."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return {"model": model, "features": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})}


def summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """The headline figures: fraction of peak per dtype for the step, its GEMMs and decode."""
    return {
        d: {
            "peak_gflops": result["gemm_peak"][d]["peak_gflops"],
            "train_step_seconds": result["train_step"][d]["step_seconds"],
            "train_fraction_of_peak": result["train_step"][d]["fraction_of_peak"],
            "train_gemm_kernel_fraction_of_peak": result["train_step"][d]["matmul_kernel_fraction_of_peak"],
            "train_matmuls_alone_fraction_of_peak": result["train_step"][d]["matmuls_alone"]["fraction_of_peak"],
            "train_kernel_floor_seconds": result["train_step"][d]["kernel_floor"]["seconds"],
            "train_fraction_of_peak_at_kernel_floor": result["train_step"][d]["kernel_floor"]["fraction_of_peak"],
            "decode_tokens_per_s": result["decode"][d]["decode_tokens_per_s"],
            "decode_fraction_of_ceiling": result["decode"][d]["fraction_of_ceiling"],
            "decode_fraction_of_peak_ceiling": result["decode"][d]["fraction_of_peak_ceiling"],
        }
        for d in DTYPES
    }


def run(quick: bool = False) -> dict[str, Any]:
    result = run_child("benchmarks.bench_roofline", [*(["--quick"] if quick else []), "--child"], THREADS)
    result["summary"] = summary(result)
    write_result("roofline_quick" if quick else "roofline", result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer GEMM sizes and repeats")
    parser.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)  # the measuring process (see module doc)
    args = parser.parse_args()
    if args.child:
        Path(args.child).write_text(json.dumps(measure(args.quick)))
    else:
        print(json.dumps(run(args.quick)["summary"], indent=2))
