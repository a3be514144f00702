"""The explorer's extra memory during a weight sync: staged (a whole version received and verified, then loaded)
against streamed (each verified chunk loaded into the engine as it arrives).

    python -m benchmarks --only receive_memory [--quick]

The real SmolLM2-135M-Instruct (`model.path: smollm2`, 134.5M parameters, 538 MB in fp32) goes from the benchmark
process (the trainer: the model's weights as the trainer sends them, `trinity.trainer.weights.named_weights`, moved
a little each version, published through `WeightSender` at the default 64 MiB buckets) to an explorer process
holding a vLLM engine (CPU build, fp32, as a CPU explorer runs) and one receiver of the gloo group. The explorer
alternates the two ways, as `WeightFeed` does them:

- staged (how every explorer took a version before streamed receives existed): `receive()`, the verified version
  kept as a list (the feed's `Staged`), then `engine.load_weights` (reload calls of 1 GiB);
- streamed: `receive_streamed()` into `engine.load_weights` (reload calls of 64 MiB), digested as it passes, then
  `finish_stream`.

For each update the explorer records its extra peak RSS (VmHWM after the update minus VmRSS before it, the
high-water mark reset through /proc/self/clear_refs; MALLOC_MMAP_THRESHOLD_=1 MiB so that freed tensors leave RSS),
the seconds from asking for the update (the trainer publishes once asked) to the engine serving it, and whether
the digest of what it loaded equals the trainer's. Ratio: streamed's median extra peak over staged's. `--quick`:
one round of each. Writes benchmarks/results/receive_memory.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.bench_weight_sync import _extra_peak
from benchmarks.common import run_child, write_result

MODES = ("staged", "streamed")
BUCKET_MB = 64.0


def _explorer(spec_json: str, model_path: str, rounds: int, out: str) -> None:
    """The measured process: a vLLM engine and the group's receiver, `rounds` updates of each mode, alternating."""
    from trinity.explorer.engines.vllm_engine import VllmEngine
    from trinity.models.digest import weights_digest
    from trinity.sync import SyncGroupSpec, WeightReceiver, load_streamed

    engine = VllmEngine(model_path=model_path, dtype="float32", max_model_len=256, kv_cache_space_gib=0.25)
    receiver = WeightReceiver(SyncGroupSpec.model_validate_json(spec_json), 1)
    receiver.init()
    rows = []
    for index in range(rounds * len(MODES)):
        mode = MODES[index % len(MODES)]

        def take(index: int = index, mode: str = mode) -> tuple[int, int, float]:
            receiver.transport.store.set(f"bench/ready/{index}", mode)  # the trainer publishes at once
            started = time.perf_counter()
            if mode == "staged":
                version, named = receiver.receive(idle_timeout_s=600)
                tensors = list(named)
                engine.load_weights(version, tensors)
                loaded = weights_digest(tensors)
            else:
                version, named = receiver.receive_streamed(idle_timeout_s=600)
                loaded = load_streamed(version, named, engine.load_weights)
            return version, loaded, time.perf_counter() - started

        extra_mb, (version, loaded, seconds) = _extra_peak(take)
        rows.append(
            {
                "mode": mode,
                "version": version,
                "extra_peak_mb": round(extra_mb, 1),
                "seconds_to_serve": round(seconds, 3),
                "digest_match": loaded == receiver.published_digest,
            }
        )
    receiver.close()
    engine.close()
    Path(out).write_text(json.dumps(rows))


def run(quick: bool = False) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from trinity.models import resolve_model_path
    from trinity.sync import SyncGroupSpec, narrowed_to, reserve_rendezvous
    from trinity.sync.collective import WeightSender
    from trinity.trainer.weights import named_weights

    rounds = 1 if quick else 3
    model_path = resolve_model_path("smollm2")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    weights = list(named_weights(model))  # what the trainer sends: checkpoint names, the tied head once
    model_bytes = sum(t.numel() * t.element_size() for _, t in weights)
    rendezvous = reserve_rendezvous(
        SyncGroupSpec.for_members("bench-receive", 0, ["explorer-0"], timeout_s=600, bucket_mb=BUCKET_MB)
    )
    result: dict[str, Any] = {}
    explorer = threading.Thread(
        target=lambda: result.update(
            rows=run_child(
                "benchmarks.bench_receive_memory",
                [rendezvous.spec.model_dump_json(), model_path, str(rounds)],
                threads=1,
                env={"MALLOC_MMAP_THRESHOLD_": str(1 << 20)},
            )
        ),
        daemon=True,
    )
    explorer.start()
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    g = torch.Generator().manual_seed(0)
    store, prefix = rendezvous.store, rendezvous.spec.store_prefix
    assert store is not None
    for version in range(1, rounds * len(MODES) + 1):
        moved = [(n, t + torch.randn(t.shape, generator=g) * 1e-3) for n, t in weights]
        store.wait([f"{prefix}/bench/ready/{version - 1}"], timedelta(minutes=10))  # the explorer's clock runs
        report = sender.publish(version, narrowed_to(moved, torch.float32))
        assert report.accepted_by_all, report.refused
        del moved
    sender.close()
    explorer.join()
    rows = result["rows"]
    summary = {
        mode: {
            "extra_peak_mb_median": statistics.median(r["extra_peak_mb"] for r in rows if r["mode"] == mode),
            "seconds_to_serve_median": statistics.median(r["seconds_to_serve"] for r in rows if r["mode"] == mode),
        }
        for mode in MODES
    }
    summary["streamed_over_staged_peak"] = round(
        summary["streamed"]["extra_peak_mb_median"] / summary["staged"]["extra_peak_mb_median"], 3
    )
    out = {
        "model": "SmolLM2-135M-Instruct (fp32 engine)",
        "model_mb": round(model_bytes / 2**20, 1),
        "bucket_mb": BUCKET_MB,
        "rows": rows,
        "summary": summary,
        "all_digests_match": all(r["digest_match"] for r in rows),
    }
    write_result("receive_memory_quick" if quick else "receive_memory", out)
    return out


if __name__ == "__main__":
    spec_json, model_path, rounds, out_path = sys.argv[1:5]
    _explorer(spec_json, model_path, int(rounds), out_path)
