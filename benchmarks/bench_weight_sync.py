"""Weight sync throughput: `trinity.sync` (gloo, bucketed, checksummed) vs a raw gloo broadcast of the same bytes.

    python -m benchmarks --only weight_sync [--quick]

A SmolLM2-135M-shaped set of fp32 tensors (30 layers, hidden 576, intermediate 1536, 9 heads / 3 kv heads,
vocab 49152, tied embeddings: 134.5M parameters, 538 MB) goes from the benchmark process (trainer,
rank 0) to one receiver process. The raw baseline is `torch.distributed.broadcast` of one flat tensor
holding the same bytes, plus a barrier so that both sides stop the clock when the receiver has the data
(ours stops after the status exchange). The two alternate within one run. Ratio = raw seconds / ours.
Writes benchmarks/results/weight_sync.json.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from benchmarks.common import write_result

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
    }
    write_result("weight_sync", result)
    return result


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
