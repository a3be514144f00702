"""GPU readiness check (`make gpu-check`): one script, four bounded parts, one JSON file, under 8 minutes.

    python benchmarks/gpu_check.py [--out FILE_OR_DIR] [--parts torch,sync,cuda_ipc,megatron]

- torch: GRPO train steps of the PyTorch backend with `trainer.device: cuda` and bf16 weights against the CPU
  fp32 reference on a tiny model, same weights and batches: loss, policy loss, entropy and grad norm of every
  step within bf16 tolerance, and the model really on the GPU (its peak allocated memory).
- sync: the weight-sync group on CUDA tensors (SmolLM2-135M-shaped, bf16/fp32 mix): NCCL from cuda:0 to cuda:1
  with two GPUs; with one, gloo with CUDA tensors on both ends (the device staging path; NCCL allows one rank
  per GPU). Every tensor compared exactly on the receiver, the median publish timed (GB/s).
- cuda_ipc: a CUDA IPC weight transfer between two processes on one GPU, with checksums and GB/s
  (`trinity.sync.cuda_ipc.check`).
- megatron: a Megatron-Core TP=1 GRPO step on CUDA against the PyTorch backend on CUDA (same SmolLM2-135M-shaped
  random weights, same batches): first-step loss agreement, export equal to the checkpoint, tokens/s; skipped
  with the reason when megatron-core is not importable.

Each part runs in a child process of its own (a CUDA failure cannot take the others down) under its own time
limit, all within the 8-minute budget. Exit status: 0 when every part that ran passed, 1 when one failed, 2 when
there is no CUDA device (at once, before anything else is imported). `--device cpu` runs every part on the CPU
(bf16 against fp32; gloo; host shared memory; Megatron over gloo on the tiny model) to test this script where
there is no GPU: its figures are no GPU figures.

It needs torch with CUDA and the repository's sources (put on sys.path here: no install); the pure-Python
packages a bare CUDA machine lacks (pydantic, structlog, redis, megatron-core, ...) come from the wheels
`make gpu-check` installs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 470.0  # the whole check, start-up of every child included: under 8 minutes
LIMITS_S = {"torch": 120.0, "sync": 90.0, "cuda_ipc": 90.0, "megatron": 160.0}
NO_CUDA_EXIT = 2
TINY: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_heads": 2,
    "num_kv_heads": 1,
}
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
# bf16 keeps 8 bits of mantissa (relative error ~4e-3 per rounding); a loss sums thousands of rounded terms.
LOSS_TOLERANCE = (0.02, 0.02)  # (absolute, relative) for loss/total, pg_loss, entropy
GRAD_NORM_TOLERANCE = (0.0, 0.1)


def use_repository_sources() -> None:
    """Every distribution's folder on sys.path, as an editable install would put it (nothing is installed on
    the GPU machine): the `trinity` namespace package then spans them."""
    folders = [p.parent for p in (*ROOT.glob("*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml"))]
    for folder in [ROOT, *sorted(f for f in folders if (f / "trinity").is_dir())]:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def within(value: float, reference: float, tolerance: tuple[float, float]) -> bool:
    absolute, relative = tolerance
    return abs(value - reference) <= absolute + relative * abs(reference)


# ---- the parts (each runs in its own child process) ------------------------------------------------------


def _rollouts(step: int, n: int, vocab: int, prompt: int, response: int) -> list[Any]:
    """GRPO rollouts (groups of 4) with sampler log-probs near a random model's (-log vocab): ratios stay inside
    the clip range, so the loss depends on the trainer's own log-probs, whose precision is under test."""
    import math

    from trinity.v1 import common_pb2

    rng = random.Random(step)
    out = []
    for i in range(n):
        length = rng.randint(response // 2, response)
        out.append(
            common_pb2.Experience(
                id=f"s{step}-{i}",
                kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                group_id=f"s{step}-g{i // 4}",
                prompt_token_ids=[rng.randrange(3, vocab) for _ in range(prompt)],
                response_token_ids=[rng.randrange(3, vocab) for _ in range(length)],
                logprobs=[-math.log(vocab) + rng.gauss(0.0, 0.05) for _ in range(length)],
                reward=float(rng.random() > 0.5),
            )
        )
    return out


def _run_config(model: Path, dtype: str = "float32", **trainer: Any) -> Any:
    from trinity.config import RunConfig

    return RunConfig.model_validate(
        {
            "mode": "train",  # with placeholder offline data: a backend reads neither
            "seed": 0,
            "model": {"path": str(model), "dtype": dtype, "max_prompt_tokens": 128, "max_response_tokens": 256},
            "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.01, "entropy_coef": 0.001},
            "buffer": {"offline_data": {"path": "unused.jsonl"}},
            "trainer": {"optimizer": {"lr": 1e-3}, **trainer},
        }
    )


def check_torch_backend(device: str) -> dict[str, Any]:
    """GRPO steps on `device` in bf16 against the CPU fp32 reference, same tiny model, same batches."""
    import torch

    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.backend import build_backend

    keys = ("loss/total", "pg_loss", "entropy", "grad_norm")
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "tiny", **TINY)
        batches = [_rollouts(step, 8, TINY["vocab_size"], 16, 32) for step in range(3)]
        runs: dict[str, list[dict[str, float]]] = {}
        for name, settings in (("reference", {"device": "cpu", "weights_dtype": "float32"}),
                               ("candidate", {"device": device, "weights_dtype": "bfloat16"})):  # fmt: skip
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            backend = build_backend(_run_config(model, micro_batch_tokens=512, **settings))
            rows = []
            for batch in batches:
                started = time.perf_counter()
                metrics = backend.train_step(batch)
                _synchronize()
                rows.append({**{k: metrics[k] for k in keys}, "seconds": time.perf_counter() - started})
            runs[name] = rows
            del backend
        peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
        model_bytes = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    steps: list[dict[str, Any]] = []
    for i, (ref, got) in enumerate(zip(runs["reference"], runs["candidate"], strict=True)):
        close = {k: within(got[k], ref[k], GRAD_NORM_TOLERANCE if k == "grad_norm" else LOSS_TOLERANCE) for k in keys}
        steps.append({"step": i + 1, "reference": ref, "candidate": got, "within_tolerance": close})
    # fp32 weights on disk; bf16 on the device is half, and the optimizer state adds more.
    on_device = peak is None or peak >= model_bytes // 2
    return {
        "device": device,
        "steps": steps,
        "peak_allocated_bytes": peak,
        "model_bytes_fp32": model_bytes,
        "ok": on_device and all(all(s["within_tolerance"].values()) for s in steps),
    }


def _sync_weights(layers: int, device: str, seed: int) -> list[tuple[str, Any]]:
    import torch

    from benchmarks.bench_weight_sync import smollm2_shapes

    generator = torch.Generator(device=device).manual_seed(seed)
    return [
        (
            name,
            torch.randn(shape, generator=generator, device=device).to(torch.bfloat16 if i % 3 == 1 else torch.float32),
        )
        for i, (name, shape) in enumerate(smollm2_shapes(layers))
    ]


def _sync_receiver(spec_json: str, device: str, layers: int, rounds: int, verified: int, results: Any) -> None:
    use_repository_sources()
    import torch

    from trinity.sync import SyncGroupSpec
    from trinity.sync.collective import WeightReceiver

    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    receiver = WeightReceiver(SyncGroupSpec.model_validate_json(spec_json), 1, device=device)
    receiver.init()
    mismatches: list[str] = []
    for round_ in range(rounds):
        version, named = receiver.receive(idle_timeout_s=60)
        if round_ < verified:
            expected = dict(_sync_weights(layers, device, seed=version))
            for name, tensor in named:
                want = expected[name]
                if tensor.device != want.device or tensor.dtype != want.dtype or not torch.equal(tensor, want):
                    mismatches.append(f"v{version} {name}")
        else:
            for _ in named:
                pass
    receiver.close()
    results.put(mismatches)


def check_sync(device: str, layers: int = 30, rounds: int = 5, verified: int = 2) -> dict[str, Any]:
    """Publish `rounds` versions; the first `verified` are compared exactly, the last ones timed."""
    import multiprocessing as mp

    import torch

    from trinity.sync import SyncGroupSpec, reserve_rendezvous
    from trinity.sync.collective import WeightSender

    two_gpus = device.startswith("cuda") and torch.cuda.device_count() >= 2
    backend, receiver_device = ("nccl", "cuda:1") if two_gpus else ("gloo", device)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    spec = SyncGroupSpec.for_members("gpu-check", 0, ["gpu-check-explorer"], backend=backend, bucket_mb=64.0)
    rendezvous = reserve_rendezvous(spec.model_copy(update={"timeout_s": 60.0}))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    args = (rendezvous.spec.model_dump_json(), receiver_device, layers, rounds, verified, results)
    process = ctx.Process(target=_sync_receiver, args=args)
    process.start()
    try:
        sender = WeightSender(rendezvous.spec, rendezvous=rendezvous, device=device)
        sender.init()
        timings, report = [], None
        for version in range(1, rounds + 1):
            weights = _sync_weights(layers, device, seed=version)
            _synchronize()
            started = time.perf_counter()
            report = sender.publish(version, iter(weights))
            timings.append(time.perf_counter() - started)
        sender.close()
        mismatches = results.get(timeout=60)
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    assert report is not None
    seconds = statistics.median(timings[verified:])
    return {
        "backend": backend,
        "devices": [device, receiver_device],
        "nccl": "ran" if two_gpus else "skipped: needs 2 GPUs (NCCL allows one rank per GPU)",
        "bytes": report.bytes,
        "buckets": report.buckets,
        "median_s": round(seconds, 4),
        "gb_per_s": round(report.bytes / seconds / 1e9, 3),
        "mismatches": mismatches,
        "ok": not mismatches and report.accepted_by_all,
    }


def check_cuda_ipc(device: str) -> dict[str, Any]:
    """`trinity.sync.cuda_ipc.check`: this process sends to a spawned receiver on the same device over CUDA IPC
    (on a CPU, through host shared memory: the same protocol), checksums compared on the receiver, GB/s."""
    from trinity.sync import cuda_ipc

    megabytes = 512.0 if device.startswith("cuda") else 16.0
    result: dict[str, Any] = cuda_ipc.check(megabytes=megabytes, rounds=5, device=device)
    result["ok"] = bool(result["checksums_match"]) and not result["refused"] and not result["receiver_errors"]
    return result


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed_steps(backend: Any, batches: list[list[Any]], warmup: int) -> dict[str, Any]:
    seconds, metrics = [], []
    for batch in batches:
        _synchronize()
        started = time.perf_counter()
        metrics.append(backend.train_step(batch))
        _synchronize()
        seconds.append(time.perf_counter() - started)
    timed = seconds[warmup:]
    tokens = statistics.mean(m["tokens"] for m in metrics[warmup:])
    return {
        "tokens_per_s": tokens * len(timed) / sum(timed),
        "step_seconds": timed,
        "first_step_loss": metrics[0]["loss/total"],
        "first_step_grad_norm": metrics[0]["grad_norm"],
    }


def check_megatron(device: str, steps: int = 4, warmup: int = 1, batch: int = 16) -> dict[str, Any]:
    """Megatron-Core TP=1 against the PyTorch backend on the same device, same random weights: SmolLM2-135M-shaped
    on a GPU, the tiny model on a CPU (where the backend runs over gloo: a test of this script, no figures)."""
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return {"skipped": "megatron-core is not importable (make gpu-check installs it from the wheel folder)"}
    import torch
    from safetensors.torch import load_file

    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.backend import build_backend

    shape = SMOLLM2_135M if device.startswith("cuda") else TINY
    out: dict[str, Any] = {"device": device, "model": shape}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "model", **shape)
        batches = [_rollouts(step, batch, shape["vocab_size"], 128, 256) for step in range(steps)]
        common = {"mini_batch_size": batch // 2, "micro_batch_tokens": 8 * 384}
        started = time.perf_counter()
        config = _run_config(model, "bfloat16", backend="megatron", tensor_parallel_size=1, **common)
        megatron = build_backend(config)
        out["megatron_startup_s"] = time.perf_counter() - started
        try:
            exported = {k: v.float().cpu() for k, v in megatron.named_weights()}
            saved = {k: v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
            out["export_equals_checkpoint"] = exported.keys() == saved.keys() and all(
                torch.equal(exported[k], saved[k].to(torch.bfloat16).float()) for k in saved
            )
            out["megatron_tp1"] = _timed_steps(megatron, batches, warmup)
        finally:
            close = getattr(megatron, "close", None)
            if close is not None:
                close()
        torch_backend = build_backend(_run_config(model, "bfloat16", device=device, **common))
        out["torch"] = _timed_steps(torch_backend, batches, warmup)
    reference = out["torch"]["first_step_loss"]
    out["first_step_loss_diff"] = abs(out["megatron_tp1"]["first_step_loss"] - reference)
    out["tokens_per_s_megatron_over_torch"] = out["megatron_tp1"]["tokens_per_s"] / out["torch"]["tokens_per_s"]
    out["ok"] = bool(out["export_equals_checkpoint"]) and within(
        out["megatron_tp1"]["first_step_loss"], reference, LOSS_TOLERANCE
    )
    return out


PARTS: dict[str, Callable[[str], dict[str, Any]]] = {
    "torch": check_torch_backend,
    "sync": check_sync,
    "cuda_ipc": check_cuda_ipc,
    "megatron": check_megatron,
}


# ---- the driver ------------------------------------------------------------------------------------------


def cuda_problem() -> str | None:
    """Why this machine cannot run the check (no torch, no CUDA device), or None."""
    try:
        import torch
    except ImportError as err:
        return f"no CUDA device: torch is not importable ({err})"
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (a CPU build)"
        return f"no CUDA device: torch {torch.__version__}, CUDA build {build}; run it on a machine with an NVIDIA GPU"
    return None


def run_part(name: str, device: str, limit_s: float, log: Path) -> dict[str, Any]:
    """`name` in a child process of its own session, killed whole (with the processes it started) at `limit_s`."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result_path = Path(handle.name)
    command = [sys.executable, __file__, "--part", name, "--device", device, "--result", str(result_path)]
    started = time.perf_counter()
    with log.open("ab") as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    seconds = round(time.perf_counter() - started, 1)
    try:
        if child.returncode == 0:
            return {**json.loads(result_path.read_text()), "seconds": seconds}
    finally:
        result_path.unlink(missing_ok=True)
    why = f"timed out after {limit_s:.0f}s" if child.returncode == -signal.SIGKILL else f"exit code {child.returncode}"
    tail = log.read_text(errors="replace")[-3000:]
    return {"ok": False, "error": f"{name}: {why}", "seconds": seconds, "log_tail": tail}


def _parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown part(s) {unknown or text!r}; known: {', '.join(PARTS)}")
    return names


def _output_path(out: str | None) -> Path:
    """A file as given; a folder (or $OUT) gets gpu_check.json; default benchmarks/results/gpu_check.json."""
    target = Path(out or os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    return target if target.suffix == ".json" else target / "gpu_check.json"


def _header(device: str) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": gpu,
        "gpus": torch.cuda.device_count() if device.startswith("cuda") else 0,
        "device": device,
    }


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="result file (.json) or folder; default $OUT or benchmarks/results")
    parser.add_argument("--parts", type=_parts, default=list(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--device", default="cuda:0", help="cuda:N; cpu only tests this script (no GPU figures)")
    parser.add_argument("--check-device", action="store_true", help="only check for a CUDA device (exit 0 or 2)")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)  # a child: run one part
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    use_repository_sources()
    if args.part is not None:
        Path(args.result).write_text(json.dumps(PARTS[args.part](args.device), default=str))
        return 0

    out = _output_path(args.out)
    problem = cuda_problem() if args.device.startswith("cuda") else None
    if args.check_device and problem is None:
        return 0
    if problem is not None:
        print(f"gpu_check: {problem}", file=sys.stderr)
        if not args.check_device and (args.out or os.environ.get("OUT")):  # the result says why there is none
            _write(out, {"ok": False, "error": problem})
        return NO_CUDA_EXIT
    payload = {**_header(args.device), "parts": {}}
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")  # every child's output, for the parts' error reports
    log.unlink(missing_ok=True)
    deadline = time.monotonic() + BUDGET_S
    for name in args.parts:
        left = deadline - time.monotonic()
        if left < 10:
            result: dict[str, Any] = {"ok": False, "error": f"not run: the {BUDGET_S:.0f}s budget was spent"}
        else:
            print(f"gpu_check: {name} (at most {min(LIMITS_S[name], left):.0f}s)", file=sys.stderr, flush=True)
            result = run_part(name, args.device, min(LIMITS_S[name], left), log)
        payload["parts"][name] = result
        _write(out, payload)  # after every part: a later hang still leaves the earlier results
    payload["ok"] = all(r.get("ok", False) or "skipped" in r for r in payload["parts"].values())
    _write(out, payload)
    print(json.dumps(payload, indent=2, default=str))
    print(f"gpu_check: {'passed' if payload['ok'] else 'FAILED'}; written to {out}", file=sys.stderr)
    return 0 if payload["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
