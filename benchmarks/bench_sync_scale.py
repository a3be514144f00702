"""Weight sync as the work grows, each point against a raw gloo baseline of the same size in the same run.

    python -m benchmarks --only sync_scale [--quick]
    python -m benchmarks.bench_sync_scale [--quick]

Case `receivers`: 2, 8 and 32 receiver processes on loopback (4 with --quick: 2 and 4). Each round forms a group
from scratch and moves one version of tiny weights (one SmolLM2 layer's k/v projections and norms: 4 tensors,
0.89 MB) through it, then leaves. Ours is the product path: the trainer's reserved rendezvous store, a new
generation of the spec per round, `open_sender(spec, rendezvous=...)` + `init()` + `publish()` on this process
(what `WeightPublisher` does once the gateway has the group ready) and `open_receiver(spec, rank)` + `init()` +
`receive()` in each member (what the explorer's weight feed does), once without a secret (`trinity run` on one
machine) and once with one (a deployment with a token: signed store, membership proof, keyed checksums). Raw is
`torch.distributed.init_process_group("gloo")` over the same store (a prefix of its own per round) + one broadcast
of the same bytes + a barrier. Kinds alternate within each group size (the order flips every repeat), so load
from other jobs falls on all of them. Clock: `go` is written to a coordination store the members wait on; the group
is formed when the last member's `init` (raw: `init_process_group`) has returned; the total ends when rank 0's
publish (raw: its barrier) returns, i.e. every member holds the version (ours: verified and reported).

Case `sizes`: one receiver process, fp32 tensors shaped like SmolLM2-135M's decoder layers (the layers and the final
norm of `smollm2_shapes`, no embedding, so 0.1 GB is 7 layers) of 0.1, 1 and 4 GB (0.02 and 0.1 with --quick), at
the product's default 64 MiB buckets, ours (`publish`, no secret; the receiver keeps what it received, as the weight
feed does, so it allocates per version) against a raw gloo broadcast of the same bytes into a fresh buffer plus a
1-element allreduce, alternating; median seconds on the sender's clock and the ratio raw / ours at each size. The
sender's weights are views into one flat buffer, so raw sends exactly those bytes and only one copy is held. Each
process's extra peak RSS per round (VmHWM above the RSS before it) is recorded too, and so is the sender's per-byte
work of a publish timed alone once per size (digest, bucket copies, bucket checksums; nothing sent).

Every process runs one torch thread and imports torch and `trinity.sync` only. Each member's store connection does a
name lookup inside torch's TCPStore client; on a host whose resolver drops a burst of UDP queries (this sandbox's),
32 members joining at once wait out its 5 s timeout, raw and ours alike: `RES_OPTIONS=use-vc` (DNS over TCP) avoids
it, and the JSON records `RES_OPTIONS`. Writes benchmarks/results/sync_scale.json and sync_scale.png
(`sync_scale_quick.*` with --quick).
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing as mp
import os
import secrets
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.bench_weight_sync import _extra_peak, _raw_broadcast, _raw_pair, _rss_kb, smollm2_shapes
from benchmarks.common import RESULTS, write_result

HOST = "127.0.0.1"
TIMEOUT = timedelta(minutes=10)
KINDS = ("raw", "ours", "ours_secret")
BUCKET_MB = 64.0
# One decoder layer of SmolLM2-135M's shapes, for sizing `sizes_case` in whole layers.
LAYER_SHAPES = [(name, shape) for name, shape in smollm2_shapes(1) if name.startswith("model.layers.0.")]
TINY_SHAPES = [(name, shape) for name, shape in LAYER_SHAPES if "k_proj" in name or "v_proj" in name or "norm" in name]


def _views(flat: Any, shapes: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, Any]]:
    """`shapes` laid end to end over `flat`: named tensors that share its memory."""
    named, offset = [], 0
    for name, shape in shapes:
        size = math.prod(shape)
        named.append((name, flat[offset : offset + size].view(shape)))
        offset += size
    return named


def _members(count: int) -> list[str]:
    return [f"explorer-{i}" for i in range(count)]


def _spec(round_: dict[str, Any]) -> Any:
    """The round's group spec with its secret, as the gateway would hand it to every member."""
    from trinity.sync import SyncGroupSpec

    secret = bytes.fromhex(round_["secret"]) if round_["secret"] else None
    return SyncGroupSpec.model_validate({**json.loads(round_["spec"]), "secret": secret})


# ---- receivers: form a group and move one tiny version, 2 / 8 / 32 receivers ---------------------------------


def _member(rank: int, coord_port: int, plan: list[dict[str, Any]]) -> None:
    """Receiver `rank` in every round that has that many receivers: wait for go, join, take one version, leave."""
    import torch
    import torch.distributed as dist

    from trinity.sync import open_receiver

    torch.set_num_threads(1)
    coord = dist.TCPStore(HOST, coord_port, is_master=False, timeout=TIMEOUT)
    numel = sum(math.prod(shape) for _, shape in TINY_SHAPES)
    for index, round_ in enumerate(plan):
        if rank > round_["receivers"]:
            continue
        coord.add(f"ready/{index}", 1)
        coord.wait([f"go/{index}"])
        if round_["kind"] == "raw":
            store = dist.TCPStore(HOST, round_["port"], is_master=False, timeout=TIMEOUT)
            group = dist.PrefixStore(f"raw/{index}", store)
            world = round_["receivers"] + 1
            dist.init_process_group("gloo", store=group, rank=rank, world_size=world, timeout=TIMEOUT)
            formed = time.monotonic()
            dist.broadcast(torch.empty(numel), src=0)
            dist.barrier()
            done = time.monotonic()
            dist.destroy_process_group()
        else:
            receiver = open_receiver(_spec(round_), rank)
            receiver.init()
            formed = time.monotonic()
            _, named = receiver.receive(idle_timeout_s=TIMEOUT.total_seconds())
            list(named)  # what the weight feed keeps for the engine
            done = time.monotonic()
            receiver.close()
        coord.set(f"times/{index}/{rank}", json.dumps([formed, done]))
    coord.set(f"rss/{rank}", str(_rss_kb("VmHWM")))


def _sender_round(round_: dict[str, Any], index: int, rendezvous: Any, tiny: list[tuple[str, Any]], flat: Any) -> float:
    """Rank 0's side of one round (`flat`: the tiny weights' bytes, for raw); when its publish (raw: barrier)
    returned, on the monotonic clock."""
    import torch.distributed as dist

    from trinity.sync import open_sender

    if round_["kind"] == "raw":
        group = dist.PrefixStore(f"raw/{index}", rendezvous.store)
        world = round_["receivers"] + 1
        dist.init_process_group("gloo", store=group, rank=0, world_size=world, timeout=TIMEOUT)
        dist.broadcast(flat, src=0)
        dist.barrier()
        done = time.monotonic()
        dist.destroy_process_group()
        return done
    sender = open_sender(_spec(round_), rendezvous=rendezvous)
    sender.init()
    report = sender.publish(1, tiny)
    done = time.monotonic()
    assert report.accepted_by_all, report.refused
    sender.close()
    return done


def receivers_case(quick: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from trinity.sync import SyncGroupSpec, reserve_rendezvous

    counts, repeats = ((2, 4), 2) if quick else ((2, 8, 32), 3)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    tiny = [(name, torch.randn(shape, generator=g)) for name, shape in TINY_SHAPES]
    tiny_flat = torch.cat([t.reshape(-1) for _, t in tiny])
    placeholder = SyncGroupSpec.for_members(
        "bench-scale", 0, _members(max(counts)), timeout_s=600, join_timeout_s=600, bucket_mb=BUCKET_MB
    )
    rendezvous = reserve_rendezvous(placeholder)
    plan: list[dict[str, Any]] = []
    # Repeat -1 is a warm-up with every member, not recorded: a process's first group pays its imports and
    # first-call costs (xxhash, the logger, gloo's), which are start-up, not forming.
    for count, repeat in [(max(counts), -1)] + [(count, repeat) for count in counts for repeat in range(repeats)]:
        for kind in KINDS if repeat % 2 == 0 else KINDS[::-1]:
            secret = secrets.token_bytes(32) if kind == "ours_secret" else None
            # Every round of ours is a new generation on the one reserved store, as re-forming is in the product.
            spec = None if kind == "raw" else rendezvous.next_generation(_members(count), secret=secret)
            plan.append(
                {
                    "kind": kind,
                    "warm_up": repeat < 0,
                    "receivers": count,
                    "port": rendezvous.port,
                    "spec": spec.model_dump_json() if spec else None,
                    "secret": secret.hex() if secret else None,
                }
            )
    coord = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    ctx = mp.get_context("spawn")
    members = [ctx.Process(target=_member, args=(rank, coord.port, plan)) for rank in range(1, max(counts) + 1)]
    started = time.monotonic()
    for process in members:
        process.start()
    samples: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        for index, round_ in enumerate(plan):
            count = round_["receivers"]
            while coord.add(f"ready/{index}", 0) < count:  # every member of the round has left the last one
                if any(p.exitcode not in (None, 0) for p in members):
                    raise RuntimeError(f"a member process failed: exit codes {[p.exitcode for p in members]}")
                time.sleep(0.005)
            go = time.monotonic()
            coord.set(f"go/{index}", "1")
            done = _sender_round(round_, index, rendezvous, tiny, tiny_flat)
            times = [json.loads(coord.get(f"times/{index}/{rank}")) for rank in range(1, count + 1)]
            formed = max(t[0] for t in times)
            if round_["warm_up"]:
                continue
            samples.setdefault((count, round_["kind"]), []).append(
                {
                    "form_s": formed - go,
                    # A member that stalls alone (a slow connect) moves the last member's time, not this one.
                    "form_median_member_s": statistics.median(t[0] for t in times) - go,
                    "publish_s": done - formed,
                    "total_s": done - go,
                }
            )
        member_rss_mb = [int(coord.get(f"rss/{rank}")) / 1024 for rank in range(1, max(counts) + 1)]
    finally:
        for process in members:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    rows = []
    for count in counts:
        row: dict[str, Any] = {"receivers": count}
        for kind in KINDS:
            runs = samples[(count, kind)]
            row[kind] = {key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]}
            row[kind]["total_s_samples"] = [round(r["total_s"], 4) for r in runs]
        for kind in KINDS[1:]:
            row[f"ratio_raw_over_{kind}"] = round(row["raw"]["total_s"] / row[kind]["total_s"], 3)
        rows.append(row)
    return {
        "tiny_tensors": len(tiny),
        "tiny_bytes": sum(t.numel() * 4 for _, t in tiny),
        "repeats": repeats,
        "rows": rows,
        "member_peak_rss_mb": {
            "median": round(statistics.median(member_rss_mb)),
            "max": round(max(member_rss_mb)),
        },
        "seconds_with_start_up": round(time.monotonic() - started, 1),
        "note": "medians over repeats; form = go until the last member's init returned (form_median_member: the "
        "median member's), publish = from then until rank 0's publish (raw: barrier) returned, total = both; every "
        "process one torch thread",
    }


# ---- sizes: one receiver, 0.1 / 1 / 4 GB ------------------------------------------------------------------------


def _size_receiver(spec_json: str, plan: list[tuple[str, int]], peaks: Any) -> None:
    import torch
    import torch.distributed as dist

    from trinity.sync import SyncGroupSpec, open_receiver

    torch.set_num_threads(1)
    spec = SyncGroupSpec.model_validate_json(spec_json)
    receiver = open_receiver(spec, 1)  # fresh buffers per version: the weight feed keeps what it received
    receiver.init()
    raw = _raw_pair(dist.TCPStore(spec.host, spec.port, is_master=False, timeout=TIMEOUT), 1)

    def take(kind: str, nbytes: int) -> Callable[[], int]:
        def step() -> int:
            if kind == "raw":
                _raw_broadcast(raw, torch.empty(nbytes, dtype=torch.uint8))
                return nbytes
            _, named = receiver.receive(idle_timeout_s=TIMEOUT.total_seconds())
            return sum(t.numel() * t.element_size() for _, t in list(named))

        return step

    for kind, nbytes in plan:
        extra, received = _extra_peak(take(kind, nbytes))
        assert received == nbytes, (kind, received, nbytes)
        peaks.put((kind, nbytes, extra))
    receiver.close()


def _filled(numel: int, block: int = 2**24) -> Any:
    """A flat fp32 buffer of random values: one random block copied over it (drawing 1G values takes a minute)."""
    import torch

    source = torch.randn(min(block, numel), generator=torch.Generator().manual_seed(0))
    flat = torch.empty(numel)
    for offset in range(0, numel, block):
        piece = flat[offset : offset + block]
        piece.copy_(source[: piece.numel()])
    return flat


def _send(kind: str, version: int, sender: Any, raw: Any, flat: Any, weights: list[tuple[str, Any]]) -> int:
    """Rank 0's side of one round of `sizes_case`; the bytes sent."""
    import torch

    if kind == "raw":
        _raw_broadcast(raw, flat.view(torch.uint8))
        return int(flat.numel()) * 4
    report = sender.publish(version, weights)
    assert report.accepted_by_all, report.refused
    return int(report.bytes)


def _sender_work(weights: list[tuple[str, Any]], spec: Any) -> dict[str, float]:
    """The per-byte work of one publish on the sender, each part timed alone over the whole version, nothing sent:
    the digest of every tensor, copying each bucket into staging, and the bucket checksums (which each receiver
    computes again on what it received)."""
    import torch

    from trinity.models.digest import weights_digest
    from trinity.sync.checksum import BucketChecksums, tensor_bytes
    from trinity.sync.protocol import ChunkLayout, chunks_of

    started = time.perf_counter()
    weights_digest(weights)
    digest_s = time.perf_counter() - started
    staging = torch.empty(spec.bucket_bytes, dtype=torch.uint8)
    checksums = BucketChecksums(spec)
    copy_s = checksum_s = 0.0
    for index, chunk in enumerate(chunks_of(weights, spec.bucket_bytes)):
        layout = ChunkLayout.plan(chunk, spec.bucket_bytes)
        sources = [tensor_bytes(t) for _, t in chunk]
        checksum = checksums.of_chunk(1, index, layout)
        for bucket_index in range(layout.bucket_count):
            started = time.perf_counter()
            bucket = layout.fill_bucket(bucket_index, sources, staging)
            copied = time.perf_counter()
            checksum(bucket_index, bucket)
            copy_s, checksum_s = copy_s + copied - started, checksum_s + time.perf_counter() - copied
    return {"digest_s": round(digest_s, 4), "copy_s": round(copy_s, 4), "checksum_s": round(checksum_s, 4)}


def sizes_case(quick: bool) -> dict[str, Any]:
    import torch

    from trinity.sync import SyncGroupSpec, open_sender, reserve_rendezvous

    sizes_gb, repeats = ((0.02, 0.1), 2) if quick else ((0.1, 1.0, 4.0), 3)
    torch.set_num_threads(1)
    layer_bytes = sum(math.prod(shape) for _, shape in LAYER_SHAPES) * 4
    shapes = {gb: smollm2_shapes(max(1, round(gb * 1e9 / layer_bytes)))[1:] for gb in sizes_gb}
    nbytes = {gb: sum(math.prod(shape) for _, shape in shapes[gb]) * 4 for gb in sizes_gb}
    plan = [
        (gb, kind)
        for gb in sizes_gb
        for repeat in range(repeats)
        for kind in (("raw", "ours") if repeat % 2 == 0 else ("ours", "raw"))
    ]
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members("bench-scale-sizes", 0, ["explorer-0"], timeout_s=600, bucket_mb=BUCKET_MB)
    )
    ctx = mp.get_context("spawn")
    peaks = ctx.Queue()
    receiver = ctx.Process(
        target=_size_receiver,
        args=(rendezvous.spec.model_dump_json(), [(kind, nbytes[gb]) for gb, kind in plan], peaks),
    )
    receiver.start()
    times: dict[tuple[float, str], list[float]] = {}
    sender_extra: dict[tuple[float, str], list[float]] = {}
    sender_rss_mb: dict[float, float] = {}
    tensors: dict[float, int] = {}
    work: dict[float, dict[str, float]] = {}
    try:
        sender = open_sender(rendezvous.spec, rendezvous=rendezvous)
        sender.init()
        raw = _raw_pair(rendezvous.store, 0)
        flat: Any = None
        weights: list[tuple[str, Any]] = []
        loaded: float | None = None
        for version, (gb, kind) in enumerate(plan, start=1):
            if loaded != gb:
                flat, weights = None, []  # the last size's buffer goes before the next is filled
                flat = _filled(nbytes[gb] // 4)
                weights, loaded = _views(flat, shapes[gb]), gb
                sender_rss_mb[gb], tensors[gb] = _rss_kb("VmRSS") / 1024, len(weights)
                work[gb] = _sender_work(weights, rendezvous.spec)
            started = time.perf_counter()
            extra, sent = _extra_peak(functools.partial(_send, kind, version, sender, raw, flat, weights))
            times.setdefault((gb, kind), []).append(time.perf_counter() - started)
            sender_extra.setdefault((gb, kind), []).append(extra)
            assert sent == nbytes[gb], (kind, sent, nbytes[gb])
        sender.close()
        receiver_extra: dict[tuple[float, str], list[float]] = {}
        for _ in plan:
            kind, size, extra = peaks.get(timeout=TIMEOUT.total_seconds())
            gb = next(g for g in sizes_gb if nbytes[g] == size)
            receiver_extra.setdefault((gb, kind), []).append(extra)
    finally:
        receiver.join(timeout=TIMEOUT.total_seconds())
        if receiver.is_alive():
            receiver.kill()
    rows = []
    for gb in sizes_gb:
        med = {kind: statistics.median(times[(gb, kind)]) for kind in ("raw", "ours")}
        rows.append(
            {
                "target_gb": gb,
                "bytes": nbytes[gb],
                "tensors": tensors[gb],
                **{
                    kind: {
                        "median_s": round(med[kind], 4),
                        "gb_per_s": round(nbytes[gb] / med[kind] / 1e9, 3),
                        "sender_extra_peak_mb": round(max(sender_extra[(gb, kind)])),
                        "receiver_extra_peak_mb": round(max(receiver_extra[(gb, kind)])),
                    }
                    for kind in ("raw", "ours")
                },
                "ratio_raw_over_ours": round(med["raw"] / med["ours"], 3),
                "ours_minus_raw_s": round(med["ours"] - med["raw"], 4),
                "sender_work_alone": work[gb],
                "sender_rss_with_weights_mb": round(sender_rss_mb[gb]),
            }
        )
    return {
        "bucket_mb": BUCKET_MB,
        "repeats": repeats,
        "rows": rows,
        "note": "sender + 1 receiver process on loopback, one torch thread each; xxh3_64 bucket checksums, no "
        "secret; medians on the sender's clock; extra peak = the most any round of the kind added to RSS; "
        "sender_work_alone = a publish's digest, bucket copies and bucket checksums timed once on the sender with "
        "nothing sent",
    }


# ---- the plot and the entry point ----------------------------------------------------------------------------------


def plot(receivers: dict[str, Any], sizes: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, (group_ax, size_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    counts = [row["receivers"] for row in receivers["rows"]]
    labels = {"raw": "raw gloo", "ours": "trinity.sync", "ours_secret": "trinity.sync, with a secret"}
    for kind, label in labels.items():
        line = group_ax.plot(counts, [row[kind]["total_s"] for row in receivers["rows"]], "o-", label=label)
        form = [row[kind]["form_s"] for row in receivers["rows"]]
        group_ax.plot(counts, form, "x--", color=line[0].get_color(), alpha=0.6, label=f"{label}: forming only")
    group_ax.set(
        xscale="log",
        yscale="log",
        xlabel="receiver processes",
        ylabel="seconds (median)",
        title="form a group + publish 0.89 MB",
    )
    group_ax.set_xticks(counts, [str(c) for c in counts])
    group_ax.xaxis.set_minor_formatter(NullFormatter())
    group_ax.legend(fontsize=8)
    gbs = [row["bytes"] / 1e9 for row in sizes["rows"]]
    for kind, label in (("raw", "raw gloo broadcast"), ("ours", "trinity.sync publish")):
        size_ax.plot(gbs, [row[kind]["median_s"] for row in sizes["rows"]], "o-", label=label)
    for gb, row in zip(gbs, sizes["rows"], strict=True):
        size_ax.annotate(f"raw/ours {row['ratio_raw_over_ours']:.2f}", (gb, row["ours"]["median_s"]), fontsize=8)
    size_ax.set(
        xscale="log",
        yscale="log",
        xlabel="GB of fp32 weights",
        ylabel="seconds (median)",
        title="one receiver, 64 MiB buckets",
    )
    size_ax.set_xticks(gbs, [f"{gb:.2g}" for gb in gbs])
    size_ax.xaxis.set_minor_formatter(NullFormatter())
    size_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool = False) -> dict[str, Any]:
    name = "sync_scale_quick" if quick else "sync_scale"
    receivers = receivers_case(quick)
    sizes = sizes_case(quick)
    plot(receivers, sizes, RESULTS / f"{name}.png")
    result = {
        "quick": quick,
        # Every member's store connection does a name lookup (torch's TCPStore client): where the resolver drops a
        # burst of them (this sandbox's UDP DNS), 32 members forming at once wait its 5 s timeout; `use-vc` (DNS
        # over TCP) does not drop them. The figures depend on it, so it is recorded.
        "res_options": os.environ.get("RES_OPTIONS"),
        "receivers": receivers,
        "sizes": sizes,
        "plot": f"benchmarks/results/{name}.png",
    }
    write_result(name, result)
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
