"""Weight sync throughput: `trinity.sync` (gloo, bucketed, checksummed) vs a raw gloo broadcast of the same bytes.

    python -m benchmarks --only weight_sync [--quick]

A SmolLM2-135M-shaped set of fp32 tensors (30 layers, hidden 576, intermediate 1536, 9 heads / 3 kv heads,
vocab 49152, tied embeddings: 134.5M parameters, 538 MB) goes from the benchmark process (trainer,
rank 0) to one receiver process. The raw baseline is `torch.distributed.broadcast` of one flat tensor
holding the same bytes, plus a barrier so that both sides stop the clock when the receiver has the data
(ours stops after the status exchange). The two alternate within one run. Ratio = raw seconds / ours.

Case `sharded`: the same model (random weights, SmolLM2-135M shapes) in a `TorchBackend` over two FSDP2 ranks
(gloo, one process each); rank 0 publishes `backend.named_weights()` (a gather per tensor on both ranks)
through `WeightSender` to one receiver, bucket by bucket, digest in the same pass, against a raw gloo broadcast
of the same bytes (gathered once beforehand) in the same run. It also publishes the way it was done before
streaming (every tensor in one `update`, then a second pass for the digest), and reports rank 0's extra peak
RSS of each: the memory a publish costs on top of the trainer (VmHWM after the publish minus VmRSS before,
the high-water mark reset through /proc/self/clear_refs; the ranks run with MALLOC_MMAP_THRESHOLD_=1 MiB so
that freed tensors leave RSS).

Case `dtype`: the real SmolLM2-135M-Instruct weights (`model.path: smollm2`, fp32 as the trainer holds them)
published to one receiver at the default 64 MiB buckets, as they are (an fp32 explorer) and cast to bf16 on the
way (`trinity.sync.narrowed_to`, as `WeightPublisher` does for a bf16 explorer), alternating: bytes on the
wire, publish seconds (the trainer's clock, the cast included), and the receiver's cast of what it got to the
engine's bf16 (what `VllmEngine._load_weights` does; nothing to do when bf16 arrived).

Writes benchmarks/results/weight_sync.json.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.common import write_result

T = TypeVar("T")
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 576, 1536, 9, 3, 49152


def smollm2_shapes(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """Hugging Face names and shapes of SmolLM2-135M (no lm_head: tied to the embedding)."""
    head_dim = HIDDEN // HEADS
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV_HEADS * head_dim, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV_HEADS * head_dim, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (p + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
        ]
    shapes.append(("model.norm.weight", (HIDDEN,)))
    return shapes


def _raw_group(address: tuple[str, int], rank: int) -> Any:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{address[0]}:{address[1]}", rank=rank, world_size=2)
    return dist


def _receiver(spec_json: str, raw_address: tuple[str, int], numel: int, plan: list[str]) -> None:
    import torch

    from trinity.sync import SyncGroupSpec
    from trinity.sync.collective import WeightReceiver

    torch.set_num_threads(1)
    dist = _raw_group(raw_address, 1)
    # The engine copies on load, so the receiver reuses its buffers across versions (as an explorer would).
    receiver = WeightReceiver(SyncGroupSpec.model_validate_json(spec_json), 1, reuse_buffers=True)
    receiver.init()
    flat = torch.empty(numel, dtype=torch.float32)
    for step in plan:
        if step == "raw":
            dist.broadcast(flat, src=0)
            dist.barrier()
        else:
            _, named = receiver.receive(idle_timeout_s=600)
            for _ in named:  # the engine would load these views; walking them is the receiver's own cost
                pass
    receiver.close()
    dist.destroy_process_group()


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    from trinity.runtime.redis_server import free_port
    from trinity.sync import SyncGroupSpec, reserve_rendezvous
    from trinity.sync.collective import WeightSender

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    layers, reps = (4, 2) if quick else (30, 5)
    bucket_sizes_mb = [16.0, 64.0, 256.0]
    g = torch.Generator().manual_seed(0)
    weights = [(name, torch.randn(shape, generator=g)) for name, shape in smollm2_shapes(layers)]
    numel = sum(t.numel() for _, t in weights)
    flat = torch.cat([t.reshape(-1) for _, t in weights])

    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members("bench", 0, ["explorer-0"], timeout_s=600, bucket_mb=bucket_sizes_mb[0])
    )
    raw_address = ("127.0.0.1", free_port())
    plan = [step for _ in range(reps) for step in ["raw", *[f"ours-{mb}" for mb in bucket_sizes_mb]]]
    process = mp.get_context("spawn").Process(
        target=_receiver, args=(rendezvous.spec.model_dump_json(), raw_address, numel, plan)
    )
    process.start()
    try:
        dist = _raw_group(raw_address, 0)
        sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
        sender.init()
        times: dict[str, list[float]] = {step: [] for step in plan}
        buckets: dict[str, int] = {}
        for version, step in enumerate(plan, start=1):
            start = time.perf_counter()
            if step == "raw":
                dist.broadcast(flat, src=0)
                dist.barrier()
            else:
                # The bucket size is the sender's choice: receivers read the layout from the CHUNK message.
                sender.spec = rendezvous.spec.model_copy(update={"bucket_mb": float(step.split("-")[1])})
                report = sender.publish(version, weights)
                assert report.accepted_by_all, report.refused
                buckets[step] = report.buckets
            times[step].append(time.perf_counter() - start)
        sender.close()
        dist.destroy_process_group()
    finally:
        process.join(timeout=600)
        if process.is_alive():
            process.kill()
    nbytes = numel * 4
    raw_s = statistics.median(times["raw"])
    ours = {
        step: {
            "bucket_mb": float(step.split("-")[1]),
            "buckets": buckets[step],
            "median_s": round(statistics.median(samples), 4),
            "gb_per_s": round(nbytes / statistics.median(samples) / 1e9, 3),
            "ratio_raw_over_ours": round(raw_s / statistics.median(samples), 3),
        }
        for step, samples in times.items()
        if step != "raw"
    }
    best = max(ours.values(), key=lambda r: r["ratio_raw_over_ours"])
    sharded = sharded_case(quick)
    in_engine_dtype = dtype_case(quick)
    result = {
        "quick": quick,
        "layers": layers,
        "tensors": len(weights),
        "parameters": numel,
        "bytes": nbytes,
        "repeats": reps,
        "raw_median_s": round(raw_s, 4),
        "raw_gb_per_s": round(nbytes / raw_s / 1e9, 3),
        "ours": ours,
        "ratio_raw_over_ours": best["ratio_raw_over_ours"],
        "best_bucket_mb": best["bucket_mb"],
        "note": "sender + 1 receiver process on loopback, OMP_NUM_THREADS=1 each; checksums xxh3_64 on both sides",
        "sharded": sharded,
        "dtype": in_engine_dtype,
    }
    write_result("weight_sync", result)
    return result


# ---- from a sharded trainer: two FSDP2 ranks, rank 0 publishes -----------------------------------------------

SHARDED_BUCKET_MB = 64.0


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _extra_peak(step: Callable[[], T]) -> tuple[float, T]:
    """`(MiB of peak RSS above the RSS before, while it ran; what step returned)`."""
    before = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    result = step()
    return (_rss_kb("VmHWM") - before) / 1024, result


def _publish_streaming(sender: Any, version: int, weights: Callable[[], Any]) -> int:
    from trinity.models.digest import WeightsDigest

    digest = WeightsDigest()
    sender.publish(version, digest.observe(weights()))
    return digest.value


def _publish_whole(sender: Any, version: int, weights: Callable[[], Any]) -> int:
    """The publish before streaming: one update with every tensor, then a second pass for the digest."""
    from trinity.models.digest import weights_digest

    sender.start(version)
    sender.update(weights())
    sender.finish(version)
    return weights_digest(weights())


def _sharded_rank(rank: int, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One of two trainer ranks; rank 0 also owns the sync group and the raw baseline's group."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from trinity.config import RunConfig
    from trinity.sync import SyncGroupSpec, reserve_rendezvous
    from trinity.sync.collective import WeightSender
    from trinity.trainer.torch_backend import TorchBackend

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(minutes=10)
    )
    config = RunConfig.model_validate(
        {
            "mode": "train",
            "model": {"path": spec["model"]},
            "algorithm": {"algorithm_type": "grpo"},
            "buffer": {"total_steps": 10, "offline_data": {"path": "unused.jsonl"}},
            "trainer": {"data_parallel_size": 2},
        }
    )
    backend = TorchBackend(config)
    gathered = [(name, tensor.clone()) for name, tensor in backend.named_weights()]  # for the raw baseline
    if rank == 1:
        passes = {"raw": 0, "gather": 1, "ours": 1, "whole": 2}  # rank 0's passes: each gather needs us too
        for step in spec["plan"]:
            for _ in range(passes[step]):
                for _ in backend.named_weights():
                    pass
        dist.destroy_process_group()
        return {}

    flat = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in gathered])
    del gathered
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members("bench-sharded", 0, ["explorer-0"], timeout_s=600, bucket_mb=SHARDED_BUCKET_MB)
    )
    spec_file = Path(spec["spec_file"])
    group = {"spec": rendezvous.spec.model_dump_json(), "bytes": flat.numel()}
    spec_file.with_suffix(".tmp").write_text(json.dumps(group))
    spec_file.with_suffix(".tmp").rename(spec_file)
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    raw = _raw_pair(rendezvous.store, 0)
    times: dict[str, list[float]] = {"raw": [], "gather": [], "ours": [], "whole": []}
    extra_mb: dict[str, list[float]] = {"ours": [], "whole": []}
    digests: set[int] = set()
    for version, step in enumerate(spec["plan"], start=1):
        started = time.perf_counter()
        if step == "raw":
            _raw_broadcast(raw, flat)
        elif step == "gather":  # what the gathers alone cost: the same pass, nothing sent
            for _ in backend.named_weights():
                pass
        else:
            publish = _publish_streaming if step == "ours" else _publish_whole
            extra, digest = _extra_peak(functools.partial(publish, sender, version, backend.named_weights))
            extra_mb[step].append(extra)
            digests.add(digest)
        times[step].append(time.perf_counter() - started)
    sender.close()
    dist.destroy_process_group()
    return {"times": times, "extra_peak_mb": extra_mb, "bytes": flat.numel(), "digests_agree": len(digests) == 1}


def _raw_pair(store: Any, rank: int) -> Any:
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.PrefixStore("raw-baseline", store), rank, 2, timedelta(minutes=10))


def _raw_broadcast(group: Any, flat: Any) -> None:
    """One broadcast of every byte, then a 1-element allreduce so the clock stops when the receiver has them."""
    import torch
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([flat], options).wait()
    group.allreduce([torch.zeros(1)]).wait()


def _sharded_receiver(spec_json: str, numel: int, plan: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from trinity.sync import SyncGroupSpec
    from trinity.sync.collective import WeightReceiver

    torch.set_num_threads(1)
    spec = SyncGroupSpec.model_validate_json(spec_json)
    receiver = WeightReceiver(spec, 1, reuse_buffers=True)
    receiver.init()
    store = dist.TCPStore(spec.host, spec.port, spec.world_size, is_master=False, timeout=spec.join_timeout)
    raw = _raw_pair(store, 1)
    flat = torch.empty(numel, dtype=torch.uint8)
    for step in plan:
        if step == "raw":
            _raw_broadcast(raw, flat)
        elif step != "gather":
            _, named = receiver.receive(idle_timeout_s=600)
            for _ in named:
                pass
    receiver.close()


def sharded_case(quick: bool) -> dict[str, Any]:
    import statistics
    import subprocess
    import sys
    import tempfile

    from trinity.models.tiny import build_tiny_llama
    from trinity.runtime.redis_server import free_port

    layers, reps = (4, 2) if quick else (30, 3)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sharded-sync-"))
    model = build_tiny_llama(
        tmp / "model",
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_layers=layers,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        max_position_embeddings=2048,
    )
    plan = [step for _ in range(reps) for step in ("raw", "gather", "ours", "whole")]
    spec = {"model": str(model), "plan": plan, "spec_file": str(tmp / "sync-spec.json")}
    port = free_port()
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_weight_sync",
                "--sharded-rank",
                str(r),
                str(port),
                json.dumps(spec),
            ],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
            # A fixed mmap threshold: freed tensors go back to the OS at once, so RSS measures what is live
            # (glibc's dynamic threshold keeps freed blocks in the heap, and the next publish reuses them unseen).
            env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(2**20)},
        )
        for r in range(2)
    ]
    receiver = None
    spec_file = Path(str(spec["spec_file"]))
    try:
        deadline = time.monotonic() + 600
        while not spec_file.exists():
            if time.monotonic() > deadline or any(r.poll() is not None for r in ranks):
                raise RuntimeError("rank 0 never reserved the sync group (see its output)")
            time.sleep(0.2)
        group = json.loads(spec_file.read_text())
        receiver = mp.get_context("spawn").Process(target=_sharded_receiver, args=(group["spec"], group["bytes"], plan))
        receiver.start()
        outputs = [r.communicate(timeout=1800)[0] for r in ranks]
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
        if receiver is not None:
            receiver.join(timeout=60)
            if receiver.is_alive():
                receiver.kill()
    if any(r.returncode != 0 for r in ranks):
        raise RuntimeError(f"a trainer rank failed: exit codes {[r.returncode for r in ranks]}")
    rank0 = json.loads(outputs[0].decode().strip().splitlines()[-1])
    med = {step: statistics.median(samples) for step, samples in rank0["times"].items()}
    nbytes = rank0["bytes"]
    return {
        "layers": layers,
        "bytes": nbytes,
        "data_parallel_size": 2,
        "bucket_mb": SHARDED_BUCKET_MB,
        "repeats": reps,
        "raw_median_s": round(med["raw"], 4),
        "gather_only_median_s": round(med["gather"], 4),
        "ours_median_s": round(med["ours"], 4),
        "whole_model_update_median_s": round(med["whole"], 4),
        "ours_gb_per_s": round(nbytes / med["ours"] / 1e9, 3),
        "ratio_raw_over_ours": round(med["raw"] / med["ours"], 3),
        "rank0_extra_peak_mb": {
            step: round(statistics.median(samples), 1) for step, samples in rank0["extra_peak_mb"].items()
        },
        "digests_agree": rank0["digests_agree"],
        "note": "2 FSDP2 ranks (gloo) + 1 receiver, OMP_NUM_THREADS=1 each; ours includes a gather per tensor on "
        "both ranks, raw broadcasts bytes gathered beforehand; whole = one update with every tensor + a second "
        "pass for the digest (the publish before streaming)",
    }


# ---- in the explorer's dtype: the real SmolLM2-135M, fp32 as trained vs cast to bf16 for a bf16 engine ----

DTYPE_BUCKET_MB = 64.0


def _dtype_receiver(spec_json: str, plan: list[str], results: Any) -> None:
    import torch

    from trinity.sync import SyncGroupSpec
    from trinity.sync.collective import WeightReceiver

    torch.set_num_threads(1)
    receiver = WeightReceiver(SyncGroupSpec.model_validate_json(spec_json), 1, reuse_buffers=True)
    receiver.init()
    for step in plan:
        _, named = receiver.receive(idle_timeout_s=600)
        started = time.perf_counter()
        for _, tensor in named:
            tensor.to(torch.bfloat16)  # a bf16 engine's load casts (a no-op view when bf16 arrived)
        results.put((step, time.perf_counter() - started))
    receiver.close()


def dtype_case(quick: bool) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    from trinity.models import resolve_model_path
    from trinity.sync import SyncGroupSpec, narrowed_to, reserve_rendezvous
    from trinity.sync.collective import WeightSender

    weights = list(load_file(Path(resolve_model_path("smollm2")) / "model.safetensors").items())
    reps = 2 if quick else 5
    plan = [step for _ in range(reps) for step in ("float32", "bfloat16")]
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members("bench-dtype", 0, ["explorer-0"], timeout_s=600, bucket_mb=DTYPE_BUCKET_MB)
    )
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_dtype_receiver, args=(rendezvous.spec.model_dump_json(), plan, results))
    process.start()
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    sent: dict[str, int] = {}
    try:
        sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
        sender.init()
        for version, step in enumerate(plan, start=1):
            started = time.perf_counter()
            report = sender.publish(version, narrowed_to(weights, getattr(torch, step)))
            times[step].append(time.perf_counter() - started)
            assert report.accepted_by_all, report.refused
            sent[step] = report.bytes
        sender.close()
        cast: dict[str, list[float]] = {"float32": [], "bfloat16": []}
        for _ in plan:
            step, seconds = results.get(timeout=600)
            cast[step].append(seconds)
    finally:
        process.join(timeout=600)
        if process.is_alive():
            process.kill()
    med = {step: statistics.median(samples) for step, samples in times.items()}
    return {
        "model": "SmolLM2-135M-Instruct (model.path: smollm2)",
        "tensors": len(weights),
        "parameters": sum(t.numel() for _, t in weights),
        "bucket_mb": DTYPE_BUCKET_MB,
        "repeats": reps,
        **{
            step: {
                "bytes": sent[step],
                "publish_median_s": round(med[step], 4),
                "receiver_cast_median_s": round(statistics.median(cast[step]), 4),
            }
            for step in times
        },
        "bytes_ratio_bf16_over_fp32": round(sent["bfloat16"] / sent["float32"], 4),
        "publish_ratio_fp32_over_bf16": round(med["float32"] / med["bfloat16"], 3),
        "note": "sender + 1 receiver process on loopback, OMP_NUM_THREADS=1 each; bf16 publish includes the "
        "trainer-side cast; receiver cast = the bf16 engine's cast on load of what arrived",
    }


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "--sharded-rank":
        print(json.dumps(_sharded_rank(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))))
    else:
        print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
