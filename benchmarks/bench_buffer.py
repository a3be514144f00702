"""Buffer throughput: gRPC Put/Read/Ack through the Buffer process versus raw redis-py on the same server.

Both sides move the same realistic experiences (200 prompt tokens, 1k response tokens with log-probs
and an action mask) and both pay for protobuf serialization: the raw producer serializes, the raw
consumer parses, as a trainer reading Redis directly would. Ratio = buffer / raw throughput.

Wall-clock ratios swing with whatever else the machine runs, so each side also reports the CPU it
used, summed over every process on the path (this client, the Buffer process, redis-server):
`ratio_cpu_round_trip` = raw CPU / buffer CPU per experience is the steadier figure on a shared machine.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import redis

from benchmarks.common import percentile, write_result
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.client import wait_until_serving
from trinity.runtime.redis_server import free_port, start_redis_server
from trinity.v1 import common_pb2

PROMPT_TOKENS, RESPONSE_TOKENS = 200, 1024


def _experience(
    i: int, prompt_tokens: int = PROMPT_TOKENS, response_tokens: int = RESPONSE_TOKENS
) -> common_pb2.Experience:
    return common_pb2.Experience(
        id=f"bench-{uuid.uuid4().hex}-{i}",
        kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
        group_id=f"g{i // 8}",
        task_id=f"bench/{i // 8}",
        model_version=1,
        prompt_token_ids=[(7 * t) % 49152 for t in range(prompt_tokens)],
        response_token_ids=[(13 * t + i) % 49152 for t in range(response_tokens)],
        logprobs=[-0.001 * (t % 997) for t in range(response_tokens)],
        action_mask=[True] * response_tokens,
        reward=float(i % 2),
    )


class CpuMeter:
    """CPU seconds used by this process, the Buffer process and redis-server since the last `lap()`."""

    def __init__(self, redis_client: redis.Redis, buffer_pid: int) -> None:
        self.redis_client = redis_client
        self.buffer_pid = buffer_pid
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        info = self.redis_client.info("cpu")
        redis_cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return time.process_time(), _process_cpu(self.buffer_pid), redis_cpu

    def lap(self) -> dict[str, float]:
        now = self._read()
        client, buffer, server = (b - a for a, b in zip(self._last, now, strict=True))
        self._last = now
        return {"client": client, "buffer": buffer, "redis": server, "total": client + buffer + server}


def _process_cpu(pid: int) -> float:
    """utime + stime of another process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


RAW_GROUP = "trainer"
_StreamReply = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]  # XREADGROUP's, as redis-py parses it


def _raw_put(client: redis.Redis, stream: str, experiences: list[common_pb2.Experience], batch: int) -> list[float]:
    """Seconds per batch of XADDs, serialization included."""
    latencies = []
    for i in range(0, len(experiences), batch):
        t0 = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for e in experiences[i : i + batch]:
            pipe.xadd(stream, {"id": e.id, "v": e.model_version, "d": e.SerializeToString()})
        pipe.execute()
        latencies.append(time.perf_counter() - t0)
    return latencies


def _raw_read_ack(client: redis.Redis, stream: str, consumer: str, want: int, batch: int) -> tuple[int, list[float]]:
    """Read (and parse) then ack batches until `want` arrived or the group has nothing left: the experiences read
    and the seconds per batch."""
    received, latencies = 0, []
    while received < want:
        t0 = time.perf_counter()
        reply = cast(_StreamReply, client.xreadgroup(RAW_GROUP, consumer, {stream: ">"}, count=batch))
        rows = reply[0][1] if reply else []
        if not rows:
            break
        parsed = [common_pb2.Experience.FromString(fields[b"d"]) for _, fields in rows]
        client.xack(stream, RAW_GROUP, *[entry_id for entry_id, _ in rows])
        latencies.append(time.perf_counter() - t0)
        received += len(parsed)
    return received, latencies


def _buffer_put(client: BufferClient, stream: str, experiences: list[common_pb2.Experience], batch: int) -> list[float]:
    """Seconds per PutExperiences call."""
    latencies = []
    for i in range(0, len(experiences), batch):
        t0 = time.perf_counter()
        client.put(stream, experiences[i : i + batch])
        latencies.append(time.perf_counter() - t0)
    return latencies


def _buffer_read_ack(
    client: BufferClient, stream: str, consumer: str, want: int, batch: int
) -> tuple[int, list[float]]:
    """`_raw_read_ack` through the Buffer: a ReadExperiences then an AckExperiences call per batch."""
    received, latencies = 0, []
    while received < want:
        t0 = time.perf_counter()
        got = client.read(stream, consumer, batch)
        if not got.experiences:
            break
        client.ack(stream, got.entry_ids)
        latencies.append(time.perf_counter() - t0)
        received += len(got)
    return received, latencies


def _raw(client: redis.Redis, experiences: list[common_pb2.Experience], batch: int) -> dict[str, Any]:
    stream = f"raw-{uuid.uuid4().hex[:8]}"
    client.xgroup_create(stream, RAW_GROUP, id="0", mkstream=True)
    start = time.perf_counter()
    put_lat = _raw_put(client, stream, experiences, batch)
    put_seconds = time.perf_counter() - start
    start = time.perf_counter()
    _, read_lat = _raw_read_ack(client, stream, "c", len(experiences), batch)
    read_seconds = time.perf_counter() - start
    client.delete(stream)
    return _summary(len(experiences), put_seconds, read_seconds, put_lat, read_lat)


def _buffer(address: str, experiences: list[common_pb2.Experience], batch: int) -> dict[str, Any]:
    stream = f"buf-{uuid.uuid4().hex[:8]}"
    with BufferClient(address) as client:
        client.create_stream(StreamConfig(name=stream))
        start = time.perf_counter()
        put_lat = _buffer_put(client, stream, experiences, batch)
        put_seconds = time.perf_counter() - start
        start = time.perf_counter()
        _, read_lat = _buffer_read_ack(client, stream, "c", len(experiences), batch)
        read_seconds = time.perf_counter() - start
    return _summary(len(experiences), put_seconds, read_seconds, put_lat, read_lat)


def _least_cpu(runs: list[dict[str, Any]]) -> float:
    return min(r["cpu_s"]["total"] for r in runs)


def _summary(n: int, put_s: float, read_s: float, put_lat: list[float], read_lat: list[float]) -> dict[str, Any]:
    return {
        "experiences": n,
        "put_per_s": n / put_s,
        "read_ack_per_s": n / read_s,
        "round_trip_per_s": n / (put_s + read_s),
        "put_batch_ms_p50": 1000 * percentile(put_lat, 50),
        "put_batch_ms_p99": 1000 * percentile(put_lat, 99),
        "read_ack_batch_ms_p50": 1000 * percentile(read_lat, 50),
        "read_ack_batch_ms_p99": 1000 * percentile(read_lat, 99),
    }


@contextlib.contextmanager
def buffer_service() -> Iterator[tuple[str, str, int]]:
    """A private redis-server and a Buffer process serving it: the Redis URL, the Buffer's address and its pid."""
    with start_redis_server() as server:
        port = free_port()
        env = {**os.environ, "TRINITY_REDIS_URL": server.url, "TRINITY_LOG_LEVEL": "WARNING"}
        buffer = subprocess.Popen(
            [sys.executable, "-m", "trinity.cli", "serve", "buffer", "--port", str(port), "--host", "127.0.0.1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            address = f"127.0.0.1:{port}"
            wait_until_serving(address, timeout=60)
            yield server.url, address, buffer.pid
        finally:
            buffer.terminate()
            buffer.wait(timeout=30)


def run(quick: bool = False) -> dict[str, Any]:
    n, batch, repeats = (512, 32, 1) if quick else (4096, 64, 5)
    experiences = [_experience(i) for i in range(n)]
    payload_kb = len(experiences[0].SerializeToString()) / 1024
    with buffer_service() as (redis_url, address, buffer_pid):
        client = redis.Redis.from_url(redis_url)
        meter = CpuMeter(client, buffer_pid)
        # Alternate the two so that machine noise hits both alike; keep the best of each.
        raw_runs, buffer_runs = [], []
        for _ in range(repeats):
            meter.lap()
            raw_runs.append({**_raw(client, experiences, batch), "cpu_s": meter.lap()})
            buffer_runs.append({**_buffer(address, experiences, batch), "cpu_s": meter.lap()})
            client.flushall()
    raw = max(raw_runs, key=lambda r: r["round_trip_per_s"])
    buf = max(buffer_runs, key=lambda r: r["round_trip_per_s"])
    result = {
        "payload_kb_per_experience": round(payload_kb, 1),
        "batch_size": batch,
        "raw_redis": raw,
        "buffer_grpc": buf,
        "ratio_round_trip": buf["round_trip_per_s"] / raw["round_trip_per_s"],
        "ratio_put": buf["put_per_s"] / raw["put_per_s"],
        "ratio_read_ack": buf["read_ack_per_s"] / raw["read_ack_per_s"],
        "ratio_cpu_round_trip": _least_cpu(raw_runs) / _least_cpu(buffer_runs),
        "target_ratio": 0.5,
    }
    write_result("buffer", result)
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
