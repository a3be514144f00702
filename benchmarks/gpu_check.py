"""GPU check (`make gpu-check`): the CUDA paths a CPU machine cannot exercise, on one GPU, in five minutes.

    python benchmarks/gpu_check.py [--out FILE_OR_DIR] [--parts versions,nccl_publish,...]

Every part runs in a child process of its own under its own time limit and ends as one of
- ok: it ran and its condition held;
- failed: it ran and the condition did not hold, it raised, or it ran past its limit (killed with its children);
- not-run: it did not run (not selected, the budget was spent, or it could not start its check).
Not-run is not success: the check passes (exit 0) only when every registered part is ok. Exit 1 otherwise, with
the failed and not-run parts listed; exit 2 at once when there is no CUDA device. One JSON file holds every part's
figures (`$OUT/gpu_check.json` or `--out`), rewritten after each part.

The parts are small on purpose: each checks one promise of the product path (`PARTS` below says which). It needs
torch with CUDA and the repository's sources (put on sys.path here: no install); the pure-Python packages a bare
CUDA machine lacks come from the wheels `make gpu-check` installs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 300.0  # the whole check on an H200, every child's start-up included
NO_CUDA_EXIT = 2
OK, FAILED, NOT_RUN = "ok", "failed", "not-run"
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
# Qwen2.5-1.5B's matmul shapes, as a Llama (no q/k/v bias): what a first real run trains.
QWEN_1P5B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_layers": 28,
    "num_heads": 12,
    "num_kv_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
# bf16 keeps 8 bits of mantissa (relative error ~4e-3 per rounding); a loss sums thousands of rounded terms.
LOSS_TOLERANCE = (0.02, 0.02)  # (absolute, relative) for loss/total, pg_loss, entropy
GRAD_NORM_TOLERANCE = (0.0, 0.1)
FAIL_FAST_S = 60.0  # a sync failure must surface within this, and close() must return within CLOSE_S
CLOSE_S = 5.0


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


# ---- the part registry ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    name: str
    limit_s: float
    run: Callable[[], dict[str, Any]]  # in the child: its figures, with "ok" (bool) or "not_run" (the reason)


PARTS: dict[str, Part] = {}


def part(name: str, limit_s: float) -> Callable[[Callable[[], dict[str, Any]]], Callable[[], dict[str, Any]]]:
    def register(run: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        PARTS[name] = Part(name, limit_s, run)
        return run

    return register


def status_of(result: dict[str, Any] | None) -> str:
    """ok only for a result that says so; a missing result, or one naming why it did not run, is not-run."""
    if result is None or "not_run" in result:
        return NOT_RUN
    return OK if result.get("ok") is True else FAILED


def summarize(results: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """Each registered part's status; `passed` only when every one of them is ok."""
    statuses = {name: status_of(results.get(name)) for name in PARTS}
    listed = {s: [n for n, got in statuses.items() if got == s] for s in (OK, FAILED, NOT_RUN)}
    return {
        "statuses": statuses,
        **{s.replace("-", "_"): names for s, names in listed.items()},
        "passed": not listed[FAILED] and not listed[NOT_RUN],
    }


def exit_code(summary: dict[str, Any]) -> int:
    return 0 if summary["passed"] else 1


def run_parts(
    selected: list[str], budget_s: float, run: Callable[[Part, float], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Every registered part's result: `run(part, limit_s)` for the selected ones while the budget lasts."""
    results: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + budget_s
    for name, entry in PARTS.items():
        left = deadline - time.monotonic()
        if name not in selected:
            results[name] = {"not_run": "not selected (--parts)"}
        elif left < 5:
            results[name] = {"not_run": f"the {budget_s:.0f}s budget was spent"}
        else:
            results[name] = run(entry, min(entry.limit_s, left))
    return results


def run_part(entry: Part, limit_s: float, log: Path) -> dict[str, Any]:
    """`entry` in a child process of its own session, killed whole (with the processes it started) at `limit_s`."""
    from benchmarks.common import run_child

    started = time.perf_counter()
    try:
        result: dict[str, Any] = run_child(
            "benchmarks.gpu_check", ["--part", entry.name], threads=8, timeout_s=limit_s, log=log
        )
        return {**result, "seconds": round(time.perf_counter() - started, 1)}
    except subprocess.TimeoutExpired:
        why = f"timed out after {limit_s:.0f}s"
    except subprocess.CalledProcessError as err:
        why = f"exit code {err.returncode}"
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    return {
        "ok": False,
        "error": f"{entry.name}: {why}",
        "seconds": round(time.perf_counter() - started, 1),
        "log_tail": tail,
    }


# ---- helpers the parts share ----------------------------------------------------------------------------------


def _cuda() -> Any:
    import torch

    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


def _spec(name: str, backend: str, explorers: int, **fields: Any) -> Any:
    from trinity.sync import SyncGroupSpec

    members = [f"explorer-{i}" for i in range(explorers)]
    return SyncGroupSpec.for_members(f"{name}-{uuid.uuid4().hex[:6]}", 0, members, backend=backend, **fields)


def _weights(shape: dict[str, Any], device: Any, seed: int) -> list[tuple[str, Any]]:
    """Hugging-Face-named random tensors of a model's shapes, bf16 and fp32 mixed, on `device`."""
    import torch

    from benchmarks.bench_weight_sync import smollm2_shapes

    generator = torch.Generator(device=device).manual_seed(seed)
    return [
        (
            name,
            torch.randn(dims, generator=generator, device=device).to(torch.bfloat16 if i % 3 == 1 else torch.float32),
        )
        for i, (name, dims) in enumerate(smollm2_shapes(shape["num_layers"]))
    ]


def _rollouts(step: int, groups: int, vocab: int, prompt: int, response: int) -> list[Any]:
    """GRPO groups of 4 sharing one prompt (the trainer computes a shared prompt once), with sampler log-probs near
    a random model's (-log vocab): ratios stay inside the clip range, so the loss depends on the trainer's own
    log-probs, whose precision is under test."""
    from trinity.v1 import common_pb2

    rng = random.Random(step)
    out = []
    for g in range(groups):
        prompt_ids = [rng.randrange(3, vocab) for _ in range(prompt)]
        for i in range(4):
            length = rng.randint(response // 2, response)
            out.append(
                common_pb2.Experience(
                    id=f"s{step}-g{g}-{i}",
                    kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                    group_id=f"s{step}-g{g}",
                    prompt_token_ids=prompt_ids,
                    response_token_ids=[rng.randrange(3, vocab) for _ in range(length)],
                    logprobs=[-math.log(vocab) + rng.gauss(0.0, 0.05) for _ in range(length)],
                    reward=float(rng.random() > 0.5),
                )
            )
    return out


def _run_config(model: Path, lr: float = 1e-3, **trainer: Any) -> Any:
    from trinity.config import RunConfig

    return RunConfig.model_validate(
        {
            "mode": "train",  # with placeholder offline data: a backend reads neither
            "seed": 0,
            "model": {"path": str(model), "dtype": "float32", "max_prompt_tokens": 512, "max_response_tokens": 512},
            "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.01, "entropy_coef": 0.001},
            "buffer": {"offline_data": {"path": "unused.jsonl"}},
            "trainer": {"optimizer": {"lr": lr}, **trainer},
        }
    )


def _kill_at_second_bucket(chunk: int, bucket: int, data: Any) -> None:
    if bucket == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _receiver(spec_json: str, plan: str, results: Any) -> None:
    """A spawned explorer-side member on cuda:0: `plan` "die" SIGKILLs itself mid-update; otherwise it reports
    how its receive ended."""
    use_repository_sources()
    from trinity.sync import SyncError, SyncGroupSpec, open_receiver

    device = _cuda()
    hook = _kill_at_second_bucket if plan == "die" else None
    receiver = open_receiver(SyncGroupSpec.model_validate_json(spec_json), 1, device=device, bucket_hook=hook)
    started = time.monotonic()
    try:
        receiver.init()
        receiver.receive(idle_timeout_s=FAIL_FAST_S)
        outcome = "received"
    except SyncError as err:
        outcome = f"SyncError: {err}"[:500]
    seconds = time.monotonic() - started
    closing = time.monotonic()
    receiver.close()
    results.put({"outcome": outcome, "seconds": round(seconds, 2), "close_s": round(time.monotonic() - closing, 2)})


def _spawn(target: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=target, args=(*args, results))
    process.start()
    return process, results


def _reap(process: Any) -> None:
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join()


def _failing_publish(sender: Any, weights: list[tuple[str, Any]]) -> dict[str, Any]:
    """Publish expecting a `SyncError`: how long it took to surface and how long `close()` took after it."""
    from trinity.sync import SyncError

    started = time.monotonic()
    error = None
    try:
        sender.init()
        sender.publish(1, weights)
    except SyncError as err:
        error = str(err)[:500]
    failed_s = time.monotonic() - started
    closing = time.monotonic()
    sender.close()
    close_s = time.monotonic() - closing
    return {"sync_error": error, "failed_after_s": round(failed_s, 2), "close_s": round(close_s, 2)}


# ---- the parts -----------------------------------------------------------------------------------------------


@part("versions", limit_s=10)
def check_versions() -> dict[str, Any]:
    """What the other parts ran on; ok when torch sees CUDA and was built with NCCL."""
    import importlib.metadata

    import torch
    import torch.distributed as dist

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    nccl = None
    if dist.is_nccl_available():
        built = torch.cuda.nccl.version()  # (major, minor, patch) in recent torch, one integer in old ones
        nccl = ".".join(map(str, built)) if isinstance(built, tuple) else str(built)
    properties = torch.cuda.get_device_properties(0)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gpu": properties.name,
        "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
        "gpus": torch.cuda.device_count(),
        **{p: version(p) for p in ("transformers", "vllm", "megatron-core", "pydantic")},
        "ok": nccl is not None,
    }


@part("nccl_publish", limit_s=20)
def check_nccl_publish() -> dict[str, Any]:
    """A one-rank NCCL group publishing SmolLM2-135M-shaped weights through `WeightSender` (the product path:
    communicator made on the given device, buckets staged and checksummed on the GPU), with a secret as in a
    deployment with a token: NCCL's rendezvous through the signed store, the membership proof, keyed checksums."""
    from trinity.sync import open_sender, reserve_rendezvous

    device = _cuda()
    rendezvous = reserve_rendezvous(_spec("nccl-publish", "nccl", 0, timeout_s=30.0, secret=os.urandom(32)))
    sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device=device)
    sender.init()
    seconds, report = [], None
    for version in (1, 2, 3):
        weights = _weights(SMOLLM2_135M, device, seed=version)
        started = time.perf_counter()
        report = sender.publish(version, weights)
        seconds.append(time.perf_counter() - started)
    sender.close()
    assert report is not None
    median = statistics.median(seconds[1:])
    return {
        "bytes": report.bytes,
        "buckets": report.buckets,
        "digest": report.digest,
        "median_s": round(median, 4),
        "gb_per_s": round(report.bytes / median / 1e9, 2),
        "ok": report.accepted_by_all and report.bytes > 0,
    }


@part("nccl_two_ranks_one_gpu", limit_s=30)
def check_nccl_two_ranks_one_gpu() -> dict[str, Any]:
    """Two NCCL ranks on one GPU (NCCL refuses that): both ends fail as a `SyncError` within FAIL_FAST_S and
    `close()` returns within CLOSE_S, instead of hanging or the watchdog killing the process."""
    from trinity.sync import open_sender, reserve_rendezvous

    device = _cuda()
    rendezvous = reserve_rendezvous(_spec("nccl-two", "nccl", 1, timeout_s=10.0, join_timeout_s=FAIL_FAST_S))
    process, results = _spawn(_receiver, rendezvous.spec.model_dump_json(), "ok")
    try:
        sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device=device)
        trainer = _failing_publish(sender, _weights({"num_layers": 1}, device, seed=1))
        explorer = results.get(timeout=FAIL_FAST_S + CLOSE_S)
    finally:
        _reap(process)
    ok = (
        trainer["sync_error"] is not None
        and trainer["failed_after_s"] < FAIL_FAST_S
        and trainer["close_s"] < CLOSE_S
        and explorer["outcome"].startswith("SyncError")
        and explorer["close_s"] < CLOSE_S
    )
    return {"trainer": trainer, "explorer": explorer, "ok": ok}


@part("cuda_ipc_2gib", limit_s=40)
def check_cuda_ipc_2gib() -> dict[str, Any]:
    """2 GiB over CUDA IPC to a receiver process on the same GPU, checksums compared (GB/s); then a receiver that
    is killed mid-update: the trainer's `SyncError` within FAIL_FAST_S and `close()` within CLOSE_S."""
    from trinity.sync import cuda_ipc, open_sender, reserve_rendezvous

    device = _cuda()
    transfer = cuda_ipc.check(megabytes=2048.0, rounds=2, device=str(device), bucket_mb=256.0)
    rendezvous = reserve_rendezvous(_spec("ipc-kill", "cuda_ipc", 1, timeout_s=10.0, bucket_mb=64.0))
    process, _ = _spawn(_receiver, rendezvous.spec.model_dump_json(), "die")
    try:
        sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device=device)
        killed = _failing_publish(sender, cuda_ipc._check_weights(2048.0, str(device)))
    finally:
        _reap(process)
    transferred = transfer["checksums_match"] and not transfer["refused"] and not transfer["receiver_errors"]
    survived = killed["sync_error"] is not None and killed["failed_after_s"] < FAIL_FAST_S
    return {
        "transfer": transfer,
        "receiver_killed": killed,
        "ok": transferred and survived and killed["close_s"] < CLOSE_S,
    }


def _ipc_sender(model_dir: str, seed: int, results: Any) -> None:
    """Trainer side of `engine_under_pressure`: publishes a model's weights (new values, `seed`) over CUDA IPC."""
    use_repository_sources()
    import torch

    from trinity.sync import open_sender, reserve_rendezvous

    device = _cuda()
    from safetensors.torch import load_file

    weights = {n: t.to(device, torch.bfloat16) for n, t in load_file(f"{model_dir}/model.safetensors").items()}
    generator = torch.Generator(device=device).manual_seed(seed)
    named = [
        (n, torch.randn(t.shape, generator=generator, device=device).to(t.dtype) * 0.02) for n, t in weights.items()
    ]
    rendezvous = reserve_rendezvous(_spec("engine", "cuda_ipc", 1, timeout_s=30.0))
    results.put(rendezvous.spec.model_dump_json())
    sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device=device)
    sender.init()
    report = sender.publish(1, named)
    sender.close()
    results.put(report.digest)


@part("engine_under_pressure", limit_s=40)
def check_engine_under_pressure() -> dict[str, Any]:
    """The transformers engine (SmolLM2-135M-shaped, bf16) on a GPU of which 90% is taken first (as vLLM's
    reservation takes it), receiving a version over CUDA IPC streamed into the engine (a GPU explorer's default):
    loaded exactly (digest), sampling changes, and the sync's extra GPU memory is less than one copy of the model
    (a staged receive holds a whole copy)."""
    import torch

    from trinity.explorer.engines import GenerationRequest, SamplingSettings, create_engine
    from trinity.models.tiny import build_tiny_llama
    from trinity.sync import SyncGroupSpec, load_streamed, open_receiver

    device = _cuda()
    total = torch.cuda.get_device_properties(0).total_memory
    taken = torch.empty(int(total * 0.9) - torch.cuda.memory_reserved(0), dtype=torch.uint8, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "model", **SMOLLM2_135M)
        engine = create_engine("transformers", model_path=str(model), seed=0, dtype="bfloat16", device=str(device))
        greedy = [GenerationRequest(prompt="The lake is", sampling=SamplingSettings(temperature=0.0, max_tokens=8))]
        before = engine.generate(greedy)[0].samples[0].token_ids
        process, results = _spawn(_ipc_sender, str(model), 7)
        try:
            spec = SyncGroupSpec.model_validate_json(results.get(timeout=30))
            receiver = open_receiver(spec, 1, device=engine.device)
            receiver.init()
            model_bytes = sum(p.numel() * p.element_size() for p in engine._model.parameters())
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
            version, named = receiver.receive_streamed(idle_timeout_s=30)
            loaded = load_streamed(version, named, engine.load_weights)
            extra = torch.cuda.max_memory_allocated() - resident
            receiver.close()
            published = results.get(timeout=30)
        finally:
            _reap(process)
        after = engine.generate(greedy)[0].samples[0].token_ids
        engine.close()
    del taken
    return {
        "taken_gib": round(total * 0.9 / 2**30, 1),
        "sync_extra_peak_mib": round(extra / 2**20, 1),
        "model_mib": round(model_bytes / 2**20, 1),
        "digest_equal": loaded == published,
        "sampling_changed": before != after,
        "ok": loaded == published and before != after and extra < model_bytes,
    }


def _share_changed(backend: Any, batch: list[Any]) -> float:
    """The share of the stored (trained) weight elements one train step changes."""
    import torch

    before = {n: t.detach().clone() for n, t in backend.named_weights()}
    backend.train_step(batch)
    changed = total = 0
    for name, tensor in backend.named_weights():
        changed += int(torch.count_nonzero(tensor.detach() != before[name]))
        total += tensor.numel()
    return changed / total


@part("trainer_parity", limit_s=45)
def check_trainer_parity() -> dict[str, Any]:
    """GRPO steps of the PyTorch backend on the GPU (bf16 with fp32 master weights) against the CPU fp32 reference,
    groups sharing their prompt, same tiny model and batches; and the share of weights one step at lr 1e-6 changes
    with bf16 weights, without and with fp32 master weights (without, nearly none: the update rounds away)."""
    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.backend import build_backend

    keys = ("loss/total", "pg_loss", "entropy", "grad_norm")
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "tiny", **TINY)
        batches = [_rollouts(step, 2, TINY["vocab_size"], 16, 32) for step in range(3)]
        runs: dict[str, list[dict[str, float]]] = {}
        for name, settings in (
            ("reference", {"device": "cpu", "weights_dtype": "float32"}),
            ("gpu", {"device": "cuda:0", "weights_dtype": "bfloat16", "fp32_master_weights": True}),
        ):
            backend = build_backend(_run_config(model, micro_batch_tokens=512, share_prompts=True, **settings))
            runs[name] = [{k: backend.train_step(b)[k] for k in keys} for b in [*batches]]
            del backend
        shares = {}
        for master in (False, True):
            config = _run_config(model, lr=1e-6, device="cuda:0", weights_dtype="bfloat16", fp32_master_weights=master)
            shares[f"fp32_master_{str(master).lower()}"] = _share_changed(build_backend(config), batches[0])
    steps: list[dict[str, Any]] = [
        {
            "reference": ref,
            "gpu": got,
            "within": {
                k: within(got[k], ref[k], GRAD_NORM_TOLERANCE if k == "grad_norm" else LOSS_TOLERANCE) for k in keys
            },
        }
        for ref, got in zip(runs["reference"], runs["gpu"], strict=True)
    ]
    parity = all(all(s["within"].values()) for s in steps)
    return {
        "steps": steps,
        "share_changed_at_lr_1e-6": shares,
        "ok": parity and shares["fp32_master_true"] > 0.9 > shares["fp32_master_false"],
    }


@part("fsdp2_nccl", limit_s=25)
def check_fsdp2_nccl() -> dict[str, Any]:
    """The trainer's FSDP2 sharding (`trinity.trainer.parallel.shard`) over a one-rank NCCL group: a step's loss
    equals the unsharded model's, and the step changes the fp32 weights."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.parallel import Precision, decoder_layers, shard

    device = _cuda()
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = build_tiny_llama(Path(tmp) / "tiny", **TINY)
            plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        sharded = shard(model, decoder_layers(model), Precision(torch.float32, compute=torch.bfloat16), device)
        ids = torch.randint(3, TINY["vocab_size"], (4, 64), generator=torch.Generator().manual_seed(0)).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            reference = float(plain(input_ids=ids, labels=ids).loss)
        loss = sharded(input_ids=ids, labels=ids).loss
        loss.backward()
        first: Any = next(sharded.parameters())  # a DTensor: its full value is gathered from the shards
        before = first.full_tensor().clone()
        torch.optim.AdamW(sharded.parameters(), lr=1e-3).step()
        changed = not torch.equal(before, first.full_tensor())
    finally:
        dist.destroy_process_group()
    return {
        "loss": float(loss),
        "unsharded_loss": reference,
        "weights_changed": changed,
        "ok": within(float(loss), reference, LOSS_TOLERANCE) and changed,
    }


@part("model_1p5b", limit_s=90)
def check_model_1p5b() -> dict[str, Any]:
    """A Qwen2.5-1.5B-shaped model through the PyTorch backend on the GPU (bf16, fp32 master weights): peak memory
    and tokens/s of a train step, and GB/s of publishing its weights (bf16, as an engine takes them) through a
    one-rank NCCL group."""
    import torch

    from trinity.models.tiny import build_tiny_llama
    from trinity.sync import narrowed_to, open_sender, reserve_rendezvous
    from trinity.trainer.backend import build_backend

    device = _cuda()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "model", **QWEN_1P5B)
        backend = build_backend(
            _run_config(
                model,
                device="cuda:0",
                weights_dtype="bfloat16",
                fp32_master_weights=True,
                micro_batch_tokens=8192,
                mini_batch_size=32,
                gradient_checkpointing=True,
            )
        )
    batches = [_rollouts(step, 8, QWEN_1P5B["vocab_size"], 256, 512) for step in range(2)]
    torch.cuda.reset_peak_memory_stats()
    seconds, tokens, loss = [], 0.0, float("nan")
    for batch in batches:
        torch.cuda.synchronize()
        started = time.perf_counter()
        metrics = backend.train_step(batch)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
        tokens, loss = metrics["tokens"], metrics["loss/total"]
    peak = torch.cuda.max_memory_allocated()
    rendezvous = reserve_rendezvous(_spec("publish-1p5b", "nccl", 0, timeout_s=60.0, bucket_mb=256.0))
    sender = open_sender(rendezvous.spec, rendezvous=rendezvous, device=device)
    sender.init()
    started = time.perf_counter()
    report = sender.publish(1, narrowed_to(backend.named_weights(), torch.bfloat16))
    publish_s = time.perf_counter() - started
    sender.close()
    return {
        "shape": QWEN_1P5B,
        "peak_allocated_gib": round(peak / 2**30, 2),
        "step_seconds": seconds,
        "tokens_per_s": round(tokens / seconds[-1], 1),
        "loss": loss,
        "sync_bytes": report.bytes,
        "sync_gb_per_s": round(report.bytes / publish_s / 1e9, 2),
        "ok": math.isfinite(loss) and report.accepted_by_all,
    }


# ---- the driver ------------------------------------------------------------------------------------------------


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


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", help="result file (.json) or folder; default $OUT or benchmarks/results")
    parser.add_argument("--parts", type=_parts, default=list(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--check-device", action="store_true", help="only check for a CUDA device (exit 0 or 2)")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)  # a child: run one part
    parser.add_argument("result", nargs="?", help=argparse.SUPPRESS)  # the child's JSON file
    args = parser.parse_args(argv)
    use_repository_sources()
    if args.part is not None:
        Path(args.result).write_text(json.dumps(PARTS[args.part].run(), default=str))
        return 0

    out = _output_path(args.out)
    problem = cuda_problem()
    if args.check_device and problem is None:
        return 0
    if problem is not None:
        print(f"gpu_check: {problem}", file=sys.stderr)
        if not args.check_device and (args.out or os.environ.get("OUT")):  # the result says why there is none
            _write(out, {"ok": False, "error": problem})
        return NO_CUDA_EXIT
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")  # every child's output, for the parts' error reports
    log.unlink(missing_ok=True)
    payload: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "parts": {}}

    def run_and_record(entry: Part, limit_s: float) -> dict[str, Any]:
        print(f"gpu_check: {entry.name} (at most {limit_s:.0f}s)", file=sys.stderr, flush=True)
        payload["parts"][entry.name] = result = run_part(entry, limit_s, log)
        _write(out, payload)  # after every part: a later hang still leaves the earlier results
        return result

    payload["parts"] = run_parts(args.parts, BUDGET_S, run_and_record)
    summary = payload["summary"] = summarize(payload["parts"])
    _write(out, payload)
    for name, status in summary["statuses"].items():
        print(f"gpu_check: {status:8} {name}", file=sys.stderr)
    verdict = "passed" if summary["passed"] else f"FAILED (failed: {summary['failed']}, not run: {summary['not_run']})"
    print(f"gpu_check: {verdict}; written to {out}", file=sys.stderr)
    return exit_code(summary)


if __name__ == "__main__":
    sys.exit(main())
