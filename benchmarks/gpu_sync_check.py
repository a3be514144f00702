"""GPU check of `trinity.sync` (run by hand on a CUDA machine; never imported by tests or `python -m benchmarks`).

    python benchmarks/gpu_sync_check.py [--layers 30] [--bucket-mb 64]

NCCL cannot put two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so:
- with >= 2 GPUs: backend "nccl", the sender on cuda:0 and the receiver on cuda:1 (the production path);
- with 1 GPU: backend "gloo" with CUDA tensors on cuda:0 in both processes (the same sender/receiver code,
  device staging and device-to-host checksums; gloo copies through host memory), and NCCL is reported skipped.
Each case sends a SmolLM2-135M-shaped set of tensors twice and checks every tensor and dtype exactly on the
receiving device, then times 3 more publishes. Prints one JSON line per case; exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_weight_sync import smollm2_shapes


def _weights(layers: int, device: str, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i, (name, shape) in enumerate(smollm2_shapes(layers)):
        dtype = torch.bfloat16 if i % 3 == 1 else torch.float32
        out.append((name, torch.randn(shape, generator=g, device=device).to(dtype)))
    return out


def _receiver(spec_json: str, device: str, layers: int, rounds: int, results: mp.Queue) -> None:
    from trinity.sync import SyncGroupSpec
    from trinity.sync.collective import WeightReceiver

    torch.cuda.set_device(device)
    receiver = WeightReceiver(SyncGroupSpec.model_validate_json(spec_json), 1, device=device)
    receiver.init()
    mismatches = []
    for round_ in range(rounds):
        version, named = receiver.receive(idle_timeout_s=300)
        if round_ < 2:
            expected = dict(_weights(layers, device, seed=version))
            for name, tensor in named:
                ref = expected[name]
                if tensor.device != torch.device(device) or tensor.dtype != ref.dtype or not torch.equal(tensor, ref):
                    mismatches.append(name)
    receiver.close()
    results.put(mismatches)


def check(backend: str, sender_device: str, receiver_device: str, layers: int, bucket_mb: float) -> dict[str, object]:
    from trinity.sync import SyncGroupSpec, reserve_rendezvous
    from trinity.sync.collective import WeightSender

    rounds = 5
    torch.cuda.set_device(sender_device)
    spec = SyncGroupSpec.for_members(f"gpu-{backend}", 0, ["gpu-explorer"], backend=backend, bucket_mb=bucket_mb)
    rendezvous = reserve_rendezvous(spec.model_copy(update={"timeout_s": 120.0}))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(
        target=_receiver, args=(rendezvous.spec.model_dump_json(), receiver_device, layers, rounds, results)
    )
    process.start()
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous, device=sender_device)
    sender.init()
    timings = []
    for version in range(1, rounds + 1):
        weights = _weights(layers, sender_device, seed=version)
        torch.cuda.synchronize()
        start = time.perf_counter()
        report = sender.publish(version, weights)
        timings.append(time.perf_counter() - start)
    sender.close()
    mismatches = results.get(timeout=300)
    process.join(timeout=60)
    seconds = sorted(timings[2:])[len(timings[2:]) // 2]
    return {
        "backend": backend,
        "devices": [sender_device, receiver_device],
        "bytes": report.bytes,
        "buckets": report.buckets,
        "median_s": round(seconds, 4),
        "gb_per_s": round(report.bytes / seconds / 1e9, 3),
        "mismatches": mismatches,
        "ok": not mismatches and report.accepted_by_all,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    gpus = torch.cuda.device_count()
    if gpus == 0:
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    ok = True
    cases = [("gloo", "cuda:0", "cuda:0")]
    if gpus >= 2:
        cases.append(("nccl", "cuda:0", "cuda:1"))
    else:
        print(json.dumps({"backend": "nccl", "skipped": "needs 2 GPUs: NCCL allows one rank per GPU"}))
    for backend, src, dst in cases:
        result = check(backend, src, dst, args.layers, args.bucket_mb)
        ok &= bool(result["ok"])
        print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
