"""A mixture of task sets: every task of a leased batch comes from a member drawn with the mixing shares.

Draw i picks a member with a generator seeded by (seed, i), among the members that can hand a task out now, their
shares renormalized over them. The draw counter lives in Redis and a lease takes its draws with one INCRBY, so
concurrent consumers and restarted replicas never reuse a draw: together they follow one sequence. A member that
runs dry during a lease (another consumer took its last tasks) gives what it has, and the rest of the batch is
drawn again without it. The mixture is exhausted when every member with a share is.

The tasks are the members' own (`Task.taskset` names the member): completion, renewal and release go to the
member, which keeps its own selector, epochs, leases and curriculum.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

import redis

from trinity.buffer.keys import MIXTURES, MixtureKeys
from trinity.buffer.tasksets.taskset import TaskSet
from trinity.config import MixtureConfig
from trinity.v1 import buffer_pb2, common_pb2


def mixing_shares(config: MixtureConfig, sizes: Sequence[int]) -> list[float]:
    """Each member's share of the draws (sum 1), from its weight (`fixed`, unset = 1), its size, rows x epochs
    (`proportional`), or its size^(1/temperature) (`temperature`)."""
    mixing = config.mixing
    if mixing.strategy == "fixed":
        raw = [1.0 if member.weight is None else member.weight for member in config.members]
    else:
        temperature = mixing.temperature if mixing.strategy == "temperature" else 1.0
        logs = [math.log(size) / temperature for size in sizes]  # in logs: size^(1/T) overflows for small T
        top = max(logs)
        raw = [math.exp(x - top) for x in logs]
    total = sum(raw)
    return [r / total for r in raw]


def draw(seed: int, index: int, shares: Sequence[float]) -> int:
    """The member draw `index` picks: member i with probability shares[i] / sum(shares) (never one with 0)."""
    point = random.Random(f"{seed}:{index}").random() * sum(shares)
    reached, last = 0.0, -1
    for i, share in enumerate(shares):
        if share > 0:
            reached, last = reached + share, i
            if point < reached:
                return i
    return last  # rounding left the point at the very end


class Mixture:
    def __init__(self, client: redis.Redis, config: MixtureConfig, members: Sequence[TaskSet]) -> None:
        self.client = client
        self.config = config
        self.members = list(members)
        self.keys = MixtureKeys(config.name)
        self.shares = mixing_shares(config, [m.total for m in self.members])

    def save_spec(self, replace: bool) -> None:
        pipe = self.client.pipeline()
        if replace:
            pipe.delete(*self.keys.all())
        pipe.set(self.keys.spec, self.config.model_dump_json())
        pipe.sadd(MIXTURES, self.config.name)
        pipe.execute()

    def lease(self, consumer: str, batch_size: int, lease_seconds: float = 0) -> tuple[list[common_pb2.Task], bool]:
        """Up to `batch_size` tasks, in draw order, each from the member its draw picked (the member's lease:
        its expired leases first, then new positions)."""
        tasks: list[common_pb2.Task] = []
        dry: set[int] = set()  # members that gave fewer tasks than drawn in this lease
        while len(tasks) < batch_size:
            live = [
                share if share > 0 and i not in dry and self.members[i].can_hand_out() else 0.0
                for i, share in enumerate(self.shares)
            ]
            if not any(live):
                break
            want = batch_size - len(tasks)
            first = int(self.client.incrby(self.keys.draws, want)) - want
            picks = [draw(self.config.mixing.seed, first + k, live) for k in range(want)]
            leased: dict[int, list[common_pb2.Task]] = {}
            for i, count in sorted(Counter(picks).items()):
                leased[i] = self.members[i].lease(consumer, count, lease_seconds)[0][::-1]  # popped from the end
                if len(leased[i]) < count:
                    dry.add(i)
            tasks += [leased[i].pop() for i in picks if leased[i]]
        return tasks, (not tasks and self.exhausted())

    def release(self, consumer: str) -> int:
        return sum(member.release(consumer) for member in self.members)

    def exhausted(self) -> bool:
        return all(member.exhausted() for member, share in zip(self.members, self.shares, strict=True) if share > 0)

    def info(self) -> buffer_pb2.MixtureInfo:
        return buffer_pb2.MixtureInfo(
            shares=self.shares, draws=int(self.client.get(self.keys.draws) or 0), exhausted=self.exhausted()
        )
