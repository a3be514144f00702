"""Buffer cost as the work grows: Put, then Read+Ack, with 1, 8 and 32 concurrent clients and experiences of 128,
8k and 32k tokens, through the Buffer process (gRPC) against raw redis-py on the same redis-server.

Each client is a process of its own, as each explorer is in a deployment, all started once and reused by every cell.
A cell (tokens x clients) moves a fixed number of bytes (`MB_PER_CELL`, at most `MAX_PER_CELL` experiences, at least
one batch per client) in two timed phases, each started by all clients at once: every client puts its share of the
experiences into one stream (explorers feeding a run's stream), then every client reads and acknowledges as a
consumer of the stream's group until the group has nothing left. Raw is `bench_buffer`'s baseline: XADD pipelines of
the same serialized experiences, XREADGROUP (parsed), XACK; both sides serialize and parse alike. Rates are the cell's
experiences over the phase's wall time, from the first client's start to the last client's end; MB is 10^6 bytes of
serialized experiences.

The machine is shared and has two cores, so wall-clock rates swing from one cell to the next: within a cell the two
sides run interleaved (raw, buffer, buffer, raw) and each keeps its better round, so noise hits both alike; the ratio
buffer / raw of the same cell is the figure to read. CPU seconds per experience, summed over the clients, the Buffer
process and redis-server, are the steadier second figure.

Redis memory per experience is the growth over the put phase of the keys' MEMORY USAGE, divided by the experiences
put: raw holds the stream, the Buffer also its dedupe set and counters. After the acks the stream keeps every entry
(an ack only leaves the pending list) until the stream is trimmed. Each side also counts the Redis commands a batch
cost (INFO commandstats), which says how many round trips and which path (e.g. the Buffer's scripted put) it took.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, Literal

import redis

from benchmarks.bench_buffer import (
    RAW_GROUP,
    CpuMeter,
    _buffer_put,
    _buffer_read_ack,
    _experience,
    _raw_put,
    _raw_read_ack,
    buffer_service,
)
from benchmarks.common import RESULTS, percentile, write_result
from trinity.buffer.keys import StreamKeys
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.v1 import common_pb2

CLIENTS = (1, 8, 32)
TOKENS = (128, 8192, 32768)
PROMPT_SHARE = 4  # a quarter of each experience's tokens are prompt, the rest response with log-probs and a mask
BATCH = 16  # experiences per put and per read: two tasks' groups of 8 samples
MB_PER_CELL = 32
MAX_PER_CELL = 8192  # 128-token experiences would need 41k to fill 32 MB: there per-call costs, not bytes, rule
Side = Literal["raw", "buffer"]
ROUNDS: tuple[Side, ...] = ("raw", "buffer", "buffer", "raw")  # each side's drift over a cell cancels


@dataclass(frozen=True)
class Job:
    side: Side
    phase: Literal["put", "read"]
    stream: str
    tokens: int
    count: int  # put: this client's share; read: the cell's total (it reads until the group has nothing left)
    consumer: str


@dataclass
class Outcome:
    start: float  # time.perf_counter(): CLOCK_MONOTONIC, one clock for every process of the machine
    end: float
    count: int
    cpu_s: float
    latencies: list[float] = field(default_factory=list)


def _client(conn: Connection, go: Event, redis_url: str, address: str) -> None:
    """One client process: runs the jobs it is sent, each once `go` is set, and sends back their outcomes."""
    raw = redis.Redis.from_url(redis_url)
    buffer = BufferClient(address)
    made: dict[tuple[int, int], list[common_pb2.Experience]] = {}  # the same experiences for both sides of a cell
    while (job := conn.recv()) is not None:
        experiences: list[common_pb2.Experience] = []
        if job.phase == "put":
            if (job.tokens, job.count) not in made:
                made.clear()
                prompt = job.tokens // PROMPT_SHARE
                made[job.tokens, job.count] = [_experience(i, prompt, job.tokens - prompt) for i in range(job.count)]
            experiences = made[job.tokens, job.count]
        conn.send(None)  # ready: the experiences are built before the clock starts
        go.wait()
        cpu, start = time.process_time(), time.perf_counter()
        if job.phase == "put" and job.side == "raw":
            count, latencies = len(experiences), _raw_put(raw, job.stream, experiences, BATCH)
        elif job.phase == "put":
            count, latencies = len(experiences), _buffer_put(buffer, job.stream, experiences, BATCH)
        elif job.side == "raw":
            count, latencies = _raw_read_ack(raw, job.stream, job.consumer, job.count, BATCH)
        else:
            count, latencies = _buffer_read_ack(buffer, job.stream, job.consumer, job.count, BATCH)
        conn.send(Outcome(start, time.perf_counter(), count, time.process_time() - cpu, latencies))
    buffer.close()


class Clients:
    """`n` client processes, started once (spawned: a forked gRPC client is not safe) and reused by every cell."""

    def __init__(self, n: int, redis_url: str, address: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.go = context.Event()
        self.conns: list[Connection] = []
        self.processes = []
        for _ in range(n):
            parent, child = context.Pipe()
            process = context.Process(target=_client, args=(child, self.go, redis_url, address), daemon=True)
            process.start()
            self.conns.append(parent)
            self.processes.append(process)

    def run(self, jobs: list[Job]) -> list[Outcome]:
        """Every job on a client of its own, started together once all are ready."""
        conns = self.conns[: len(jobs)]
        self.go.clear()
        for conn, job in zip(conns, jobs, strict=True):
            conn.send(job)
        for conn in conns:
            conn.recv()
        self.go.set()
        return [conn.recv() for conn in conns]

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a client that died has raised in `run` already; its error tells why
                conn.send(None)
        for process in self.processes:
            process.join(timeout=30)


def _per_client(clients: int, payload_bytes: int, mb: float, most: int) -> int:
    """Each client's share of a cell: whole batches, at least one."""
    total = min(most, mb * 1e6 / payload_bytes)
    return BATCH * max(1, math.ceil(total / clients / BATCH))


def _phase(outcomes: list[Outcome], payload_bytes: int, servers_cpu: dict[str, float]) -> dict[str, Any]:
    """A phase's rates, and its CPU by process: the clients (not this process, which only waits) and the servers."""
    count = sum(o.count for o in outcomes)
    cpu = {"clients": sum(o.cpu_s for o in outcomes), "buffer": servers_cpu["buffer"], "redis": servers_cpu["redis"]}
    seconds = max(o.end for o in outcomes) - min(o.start for o in outcomes)
    latencies = [x for o in outcomes for x in o.latencies]
    return {
        "experiences": count,
        "seconds": seconds,
        "per_s": count / seconds,
        "mb_per_s": count * payload_bytes / seconds / 1e6,
        "batch_ms_p50": 1000 * percentile(latencies, 50),
        "batch_ms_p99": 1000 * percentile(latencies, 99),
        "cpu_ms_per_experience": 1000 * sum(cpu.values()) / count,
        "cpu_ms_per_experience_by_process": {k: 1000 * v / count for k, v in cpu.items()},
    }


def _key_bytes(client: redis.Redis) -> dict[str, int]:
    """MEMORY USAGE of every key, all of it (SAMPLES 0): the server holds only the keys of the round measured.
    Counted by key because INFO's used_memory moves with the clients' query buffers, 32 of them of megabytes each
    (and used_memory_dataset, used_memory less those, wraps around below zero when they shrink)."""
    return {key.decode(): int(client.memory_usage(key, samples=0) or 0) for key in client.scan_iter(count=1000)}


# This process's own commands, left out of the commands the clients' work cost Redis.
_OWN = {"info", "memory|usage", "scan", "xlen", "xpending", "xgroup|create", "flushall"}


def _calls(client: redis.Redis) -> Counter[str]:
    """Redis commands executed so far, by name."""
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def _per_batch(before: Counter[str], after: Counter[str], batches: float) -> dict[str, float]:
    """Commands Redis ran per batch of experiences between two `_calls`, this process's own left out."""
    return {k: round(v / batches, 2) for k, v in sorted((after - before).items()) if k not in _OWN}


@dataclass(frozen=True)
class Cell:
    tokens: int
    clients: int
    per_client: int
    payload_bytes: int


def _round(
    side: Side, clients: Clients, client: redis.Redis, meter: CpuMeter, address: str, cell: Cell
) -> dict[str, Any]:
    """One side of a cell: its clients put, then read and ack, in a stream of its own; the server is emptied after."""
    stream = f"{side}-{uuid.uuid4().hex[:8]}"
    if side == "raw":
        key = stream
        client.xgroup_create(stream, RAW_GROUP, id="0", mkstream=True)
    else:
        key = StreamKeys(stream).stream
        with BufferClient(address) as buffer:
            buffer.create_stream(StreamConfig(name=stream))
    n, total, payload = cell.clients, cell.clients * cell.per_client, cell.payload_bytes
    empty = _key_bytes(client)
    calls = _calls(client)
    meter.lap()
    put = clients.run([Job(side, "put", stream, cell.tokens, cell.per_client, "") for _ in range(n)])
    put_cpu = meter.lap()
    put_calls = _calls(client)
    held = _key_bytes(client)
    read = clients.run([Job(side, "read", stream, cell.tokens, total, f"c{i}") for i in range(n)])
    read_cpu = meter.lap()
    read_calls = _calls(client)
    length = int(client.xlen(key))
    pending = int(client.xpending(key, RAW_GROUP if side == "raw" else StreamConfig().group)["pending"])
    client.flushall()
    read_count = sum(o.count for o in read)
    if length != total or read_count != total or pending:
        raise RuntimeError(f"{side}: put {total}, stream holds {length}, read {read_count}, {pending} left pending")
    return {
        "put": _phase(put, payload, put_cpu),
        "read_ack": _phase(read, payload, read_cpu),
        "redis_bytes_per_experience": (sum(held.values()) - sum(empty.values())) / total,
        "redis_bytes_by_key": {k.removeprefix(key) or "stream": v - empty.get(k, 0) for k, v in held.items()},
        "redis_commands_per_put": _per_batch(calls, put_calls, total / BATCH),
        "redis_commands_per_read": _per_batch(put_calls, read_calls, total / BATCH),
    }


def _cell(
    clients: Clients, client: redis.Redis, meter: CpuMeter, address: str, tokens: int, n: int, mb: float, most: int
) -> dict[str, Any]:
    prompt = tokens // PROMPT_SHARE
    payload = len(_experience(0, prompt, tokens - prompt).SerializeToString())
    cell = Cell(tokens, n, _per_client(n, payload, mb, most), payload)
    runs: dict[Side, list[dict[str, Any]]] = {"raw": [], "buffer": []}
    for side in ROUNDS:
        runs[side].append(_round(side, clients, client, meter, address, cell))
    best = {side: _best(rounds) for side, rounds in runs.items()}
    raw, buf = best["raw"], best["buffer"]
    return {
        "tokens": tokens,
        "clients": n,
        "payload_bytes": payload,
        "experiences": cell.per_client * n,
        "raw_redis": raw,
        "buffer_grpc": buf,
        "ratio_put": buf["put"]["per_s"] / raw["put"]["per_s"],
        "ratio_read_ack": buf["read_ack"]["per_s"] / raw["read_ack"]["per_s"],
        "ratio_cpu_put": raw["put"]["cpu_ms_per_experience"] / buf["put"]["cpu_ms_per_experience"],
        "ratio_cpu_read_ack": raw["read_ack"]["cpu_ms_per_experience"] / buf["read_ack"]["cpu_ms_per_experience"],
        "ratio_redis_bytes": buf["redis_bytes_per_experience"] / raw["redis_bytes_per_experience"],
        "rounds": runs,
    }


def _best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each phase's fastest round and its least CPU (noise only ever slows a round down)."""
    best = dict(rounds[0])
    for phase in ("put", "read_ack"):
        fastest = dict(max((r[phase] for r in rounds), key=lambda p: p["per_s"]))
        thriftiest = min((r[phase] for r in rounds), key=lambda p: p["cpu_ms_per_experience"])
        for key in ("cpu_ms_per_experience", "cpu_ms_per_experience_by_process"):
            fastest[key] = thriftiest[key]
        best[phase] = fastest
    return best


def plot(cells: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(22, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    sizes = sorted({c["tokens"] for c in cells})
    for tokens, color in zip(sizes, colors, strict=False):
        row = sorted((c for c in cells if c["tokens"] == tokens), key=lambda c: c["clients"])
        x = [c["clients"] for c in row]
        for ax, phase in ((axes[0], "put"), (axes[1], "read_ack")):
            ax.plot(x, [c["buffer_grpc"][phase]["mb_per_s"] for c in row], "o-", color=color, label=f"{tokens} buffer")
            ax.plot(x, [c["raw_redis"][phase]["mb_per_s"] for c in row], "s--", color=color, label=f"{tokens} raw")
        for ax, kind in ((axes[2], "ratio"), (axes[3], "ratio_cpu")):
            ax.plot(x, [c[f"{kind}_put"] for c in row], "o-", color=color, label=f"{tokens} put")
            ax.plot(x, [c[f"{kind}_read_ack"] for c in row], "^:", color=color, label=f"{tokens} read+ack")
    for side, marker in (("buffer_grpc", "o-"), ("raw_redis", "s--")):
        per_size = [
            sum(c[side]["redis_bytes_per_experience"] for c in cells if c["tokens"] == t)
            / sum(c["payload_bytes"] for c in cells if c["tokens"] == t)
            for t in sizes
        ]
        axes[4].plot(sizes, per_size, marker, label=side.replace("_", " "))
    axes[0].set_title("put MB/s (solid: buffer, dashed: raw)")
    axes[1].set_title("read+ack MB/s")
    axes[2].set_title("buffer / raw, experiences/s")
    axes[3].set_title("raw / buffer, CPU per experience")
    axes[4].set_title("Redis bytes per payload byte")
    for ax in axes[:4]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(CLIENTS, [str(c) for c in CLIENTS])
        ax.set_xlabel("concurrent client processes")
    for ax in axes[:2]:
        ax.set_yscale("log")
    for ax in axes[2:4]:
        ax.axhline(1.0, color="grey", lw=0.8)
    axes[4].set_xscale("log", base=2)
    axes[4].set_xticks(sizes, [str(t) for t in sizes])
    axes[4].set_xlabel("tokens per experience")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(quick: bool = False) -> dict[str, Any]:
    clients_sweep, tokens_sweep = ((1, 8), (128, 8192)) if quick else (CLIENTS, TOKENS)
    mb, most = (2, 512) if quick else (MB_PER_CELL, MAX_PER_CELL)
    name = "buffer_scale_quick" if quick else "buffer_scale"  # a smoke run keeps the full result
    started = time.perf_counter()
    cells = []
    with buffer_service() as (redis_url, address, buffer_pid):
        client = redis.Redis.from_url(redis_url)
        meter = CpuMeter(client, buffer_pid)
        clients = Clients(max(clients_sweep), redis_url, address)
        try:
            for tokens in tokens_sweep:
                for n in clients_sweep:
                    cells.append(_cell(clients, client, meter, address, tokens, n, mb, most))
                    print(_line(cells[-1]), flush=True)
        finally:
            clients.close()
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(cells, RESULTS / f"{name}.png")
    result = {
        "quick": quick,
        "setup": {
            "clients": list(clients_sweep),
            "tokens": list(tokens_sweep),
            "prompt_share": 1 / PROMPT_SHARE,
            "batch": BATCH,
            "mb_per_cell": mb,
            "max_experiences_per_cell": most,
            "rounds": list(ROUNDS),
            "clients_are": "processes (spawned), one stream, each client its own consumer of the group",
            "table_pairs": "[buffer, raw]",
        },
        "seconds": time.perf_counter() - started,
        "table": [_row(c) for c in cells],
        "cells": cells,
        "plot": str((RESULTS / f"{name}.png").relative_to(RESULTS.parent.parent)),
    }
    write_result(name, result)
    return {k: v for k, v in result.items() if k != "cells"}


def _row(cell: dict[str, Any]) -> dict[str, Any]:
    raw, buf = cell["raw_redis"], cell["buffer_grpc"]
    return {
        "tokens": cell["tokens"],
        "clients": cell["clients"],
        "experiences": cell["experiences"],
        "put_per_s": [round(buf["put"]["per_s"]), round(raw["put"]["per_s"])],
        "put_mb_per_s": [round(buf["put"]["mb_per_s"], 1), round(raw["put"]["mb_per_s"], 1)],
        "read_ack_per_s": [round(buf["read_ack"]["per_s"]), round(raw["read_ack"]["per_s"])],
        "read_ack_mb_per_s": [round(buf["read_ack"]["mb_per_s"], 1), round(raw["read_ack"]["mb_per_s"], 1)],
        "ratio_put": round(cell["ratio_put"], 2),
        "ratio_read_ack": round(cell["ratio_read_ack"], 2),
        "ratio_cpu_put": round(cell["ratio_cpu_put"], 2),
        "ratio_cpu_read_ack": round(cell["ratio_cpu_read_ack"], 2),
        "redis_bytes_per_experience": [
            round(buf["redis_bytes_per_experience"]),
            round(raw["redis_bytes_per_experience"]),
        ],
        "payload_bytes": cell["payload_bytes"],
        # EVALSHA of the PUT script: a put whose optimistic MULTI another put's seen-set write aborted
        "buffer_scripted_put_share": buf["redis_commands_per_put"].get("evalsha", 0.0),
        "buffer_process_cpu_ms_per_experience": [
            round(buf[phase]["cpu_ms_per_experience_by_process"]["buffer"], 3) for phase in ("put", "read_ack")
        ],
    }


def _line(cell: dict[str, Any]) -> str:
    row = _row(cell)
    return " ".join(f"{k}={v}" for k, v in row.items())


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
