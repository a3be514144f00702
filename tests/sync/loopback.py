"""A trainer's sender and one explorer's receiver in this process, joined on loopback (one process, two threads:
the gloo group is as real as across processes, without a second torch import)."""

from __future__ import annotations

import threading
import uuid

from trinity.sync import SyncGroupSpec, WeightReceiver, WeightSender, reserve_rendezvous


def loopback_pair(timeout_s: float = 30, bucket_mb: float = 0.01) -> tuple[WeightSender, WeightReceiver]:
    """An initialized sender (rank 0) and receiver (rank 1) of a fresh group; the caller closes both."""
    spec = SyncGroupSpec.for_members(
        f"t{uuid.uuid4().hex[:8]}", 0, ["explorer-0"], timeout_s=timeout_s, bucket_mb=bucket_mb
    )
    rendezvous = reserve_rendezvous(spec)
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    joined = threading.Thread(target=sender.init)
    joined.start()
    receiver = WeightReceiver(rendezvous.spec, 1)
    receiver.init()
    joined.join()
    return sender, receiver
