"""What authenticated weight sync costs (a deployment with a token): keyed bucket checksums against xxh3_64.

    python -m benchmarks --only sync_auth [--quick]

Case `checksums`: one bucket of random bytes (16 and 64 MiB, on the CPU) through `BucketChecksums` without a
secret (`xxh3_64`, as without a token) and with one (HMAC-SHA256: what a group with a secret computes), plus keyed
BLAKE2b from hashlib for comparison; median seconds of repeats on one core, as MB/s. Sender and receiver each pay
this once per bucket.

Case `publish`: SmolLM2-135M-shaped fp32 tensors (538 MB; 4 layers with --quick) from this process to one receiver
process over gloo on loopback at 64 MiB buckets: a group with a secret and one without, alternating; median publish
seconds on the trainer's clock (a publish ends when the receiver has verified every bucket and reported).

Writes benchmarks/results/sync_auth.json.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.bench_weight_sync import smollm2_shapes
from benchmarks.common import write_result

BUCKET_MB = 64.0


def _median_seconds(step: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def checksums_case(quick: bool) -> dict[str, Any]:
    import hashlib

    import torch

    from trinity.sync import SyncGroupSpec
    from trinity.sync.checksum import BucketChecksums
    from trinity.sync.protocol import ChunkLayout

    torch.set_num_threads(1)
    repeats = 3 if quick else 9
    key = secrets.token_bytes(32)
    plain = SyncGroupSpec.for_members("bench", 0, ["explorer-0"])
    keyed = SyncGroupSpec.for_members("bench", 0, ["explorer-0"], secret=key)
    out: dict[str, Any] = {}
    for mb in (16, 64):
        nbytes = mb * 2**20
        bucket = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        layout = ChunkLayout.plan([("w", bucket)], nbytes)
        ways: dict[str, Callable[[int, torch.Tensor], object]] = {
            "xxh3_64": BucketChecksums(plain).of_chunk(1, 0, layout),
            "hmac_sha256": BucketChecksums(keyed).of_chunk(1, 0, layout),
            "blake2b_keyed": lambda _, b: hashlib.blake2b(b.numpy().data, key=key, digest_size=16).digest(),
        }
        out[f"{mb}_mib"] = {}
        for name, way in ways.items():
            seconds = _median_seconds(lambda: way(0, bucket), repeats)  # noqa: B023 - called before the loop moves on
            out[f"{mb}_mib"][name] = {"median_s": round(seconds, 5), "mb_per_s": round(nbytes / 1e6 / seconds)}
    return {"repeats": repeats, **out}


def _receiver(spec_json: str, secret: bytes | None, versions: int) -> None:
    import torch

    from trinity.sync import SyncGroupSpec
    from trinity.sync.collective import WeightReceiver

    torch.set_num_threads(1)
    spec = SyncGroupSpec.model_validate({**json.loads(spec_json), "secret": secret})
    receiver = WeightReceiver(spec, 1, reuse_buffers=True)  # as an explorer: its engine copies on load
    receiver.init()
    for _ in range(versions):
        _, named = receiver.receive(idle_timeout_s=600)
        for _ in named:
            pass
    receiver.close()


def publish_case(quick: bool) -> dict[str, Any]:
    import torch

    from trinity.sync import SyncGroupSpec, reserve_rendezvous
    from trinity.sync.collective import WeightSender

    torch.set_num_threads(1)
    layers, repeats = (4, 3) if quick else (30, 5)
    g = torch.Generator().manual_seed(0)
    weights = [(name, torch.randn(shape, generator=g)) for name, shape in smollm2_shapes(layers)]
    ctx = mp.get_context("spawn")
    senders: dict[str, WeightSender] = {}
    processes = []
    try:
        for name, secret in (("plain", None), ("authenticated", secrets.token_bytes(32))):
            spec = SyncGroupSpec.for_members(
                f"bench-{name}", 0, ["explorer-0"], timeout_s=600, bucket_mb=BUCKET_MB, secret=secret
            )
            rendezvous = reserve_rendezvous(spec)
            process = ctx.Process(target=_receiver, args=(rendezvous.spec.model_dump_json(), secret, repeats))
            process.start()
            processes.append(process)
            senders[name] = WeightSender(rendezvous.spec, rendezvous=rendezvous)
            senders[name].init()
        times: dict[str, list[float]] = {name: [] for name in senders}
        sent = 0
        for version in range(1, repeats + 1):
            for name, sender in senders.items():
                started = time.perf_counter()
                report = sender.publish(version, weights)
                times[name].append(time.perf_counter() - started)
                assert report.accepted_by_all, report.refused
                sent = report.bytes
    finally:
        for sender in senders.values():
            sender.close()
        for process in processes:
            process.join(timeout=600)
            if process.is_alive():
                process.kill()
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    return {
        "bytes": sent,
        "bucket_mb": BUCKET_MB,
        "repeats": repeats,
        **{f"{name}_median_s": round(seconds, 4) for name, seconds in medians.items()},
        "authenticated_over_plain": round(medians["authenticated"] / medians["plain"], 3),
        "note": "sender + 1 receiver process on loopback, one torch thread each; both sides hash every bucket",
    }


def run(quick: bool = False) -> dict[str, Any]:
    result = {"quick": quick, "checksums": checksums_case(quick), "publish": publish_case(quick)}
    write_result("sync_auth", result)
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
