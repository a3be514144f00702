"""Producer and consumer processes for the no-loss test (run as `python -m tests.buffer.workers`)."""

from __future__ import annotations

import argparse
import sys
import time

from tests.buffer.helpers import experience
from trinity.clients import BufferClient


def produce(address: str, stream: str, producer: int, count: int, batch: int) -> None:
    with BufferClient(address) as client:
        for start in range(0, count, batch):
            items = [experience(id=f"p{producer}-{i}", tokens=32) for i in range(start, min(start + batch, count))]
            client.put(stream, items)
            client.put(stream, items[:2])  # a producer retry: the Buffer must drop these as duplicates


def consume(address: str, stream: str, consumer: str, log_path: str, hold_after_first: bool, expect: int) -> None:
    """Train on batches: read, record what was trained, ack. Dedupe by experience id, as a trainer does.

    With `hold_after_first`, announce the first batch and stall before acknowledging it (the test
    kills the process there, mid-batch). Stops once `expect` distinct experiences are trained.
    """
    trained: set[str] = set()
    with BufferClient(address) as client, open(log_path, "a", buffering=1) as log:
        while len(trained) < expect or hold_after_first:
            batch = client.read(stream, consumer, 16, block_ms=200)
            if not batch.experiences:
                continue
            if hold_after_first:
                print("HOLDING", len(batch), flush=True)
                time.sleep(3600)
            fresh = [e.id for e in batch.experiences if e.id not in trained]
            trained.update(fresh)
            for exp_id in fresh:  # the "train step" commits before the ack
                log.write(exp_id + "\n")
            client.ack(stream, batch.entry_ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--producer", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--consumer", default="")
    parser.add_argument("--log", default="")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--expect", type=int, default=0)
    args = parser.parse_args()
    if args.role == "produce":
        produce(args.address, args.stream, args.producer, args.count, args.batch)
    else:
        consume(args.address, args.stream, args.consumer, args.log, args.hold, args.expect)
    sys.exit(0)


if __name__ == "__main__":
    main()
