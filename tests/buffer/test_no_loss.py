"""Nothing lost, nothing trained twice: producers, two consumers, one killed with SIGKILL mid-batch."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

from trinity.clients import BufferClient
from trinity.config import StreamConfig

PRODUCERS = 3
PER_PRODUCER = 120


def _worker(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.buffer.workers", *args], **kwargs)


def test_every_experience_is_trained_exactly_once_when_a_consumer_dies(buffer_service, unique, tmp_path: Path):
    address = buffer_service.address
    with BufferClient(address) as client:
        client.create_stream(StreamConfig(name=unique, claim_idle_ms=1000))

        victim_log = tmp_path / "victim.log"
        victim = _worker(
            "consume", "--address", address, "--stream", unique, "--consumer", "victim",
            "--log", str(victim_log), "--hold", stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        producers = [
            _worker("produce", "--address", address, "--stream", unique, "--producer", str(p),
                    "--count", str(PER_PRODUCER))
            for p in range(PRODUCERS)
        ]  # fmt: skip

        held = victim.stdout.readline().split()  # the victim has a batch in hand and will not ack it
        assert held[0] == "HOLDING" and int(held[1]) > 0
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()

        survivor_log = tmp_path / "survivor.log"
        survivor = _worker(
            "consume", "--address", address, "--stream", unique, "--consumer", "survivor", "--log", str(survivor_log),
            "--expect", str(PRODUCERS * PER_PRODUCER),
        )  # fmt: skip
        for p in producers:
            assert p.wait(timeout=120) == 0
        assert survivor.wait(timeout=300) == 0

        trained = survivor_log.read_text().split() + (victim_log.read_text().split() if victim_log.exists() else [])
        expected = {f"p{p}-{i}" for p in range(PRODUCERS) for i in range(PER_PRODUCER)}
        counts = collections.Counter(trained)
        assert set(counts) == expected, f"lost: {sorted(expected - set(counts))[:5]}"
        assert max(counts.values()) == 1

        stats = client.stream(unique).stats
        assert stats.put == PRODUCERS * PER_PRODUCER
        assert stats.dropped["duplicate"] > 0  # the producers' retries were caught at the door
        assert stats.pending == 0
        assert stats.acked == PRODUCERS * PER_PRODUCER
        # the killed batch was delivered twice (more redeliveries are allowed: at-least-once)
        assert stats.delivered >= stats.acked + int(held[1])
