"""Redis key layout of the Buffer; one place so that nothing else spells a key by hand."""

from __future__ import annotations

PREFIX = "trinity"

STREAMS = f"{PREFIX}:streams"
TASKSETS = f"{PREFIX}:tasksets"
MIXTURES = f"{PREFIX}:mixtures"


class StreamKeys:
    def __init__(self, name: str) -> None:
        base = f"{PREFIX}:stream:{{{name}}}"  # hash tag: every key of one stream lands on one cluster slot
        self.stream = base
        self.spec = f"{base}:spec"
        self.dead_letters = f"{base}:dlq"
        self.stats = f"{base}:stats"
        self.seen = f"{base}:seen"
        self.put_guard = f"{base}:guard"  # written when a put finds duplicates, to abort its optimistic MULTI
        self.priority = f"{base}:prio"
        self.uses = f"{base}:uses"

    def all(self) -> list[str]:
        return [
            self.stream,
            self.spec,
            self.dead_letters,
            self.stats,
            self.seen,
            self.put_guard,
            self.priority,
            self.uses,
        ]


class TaskSetKeys:
    def __init__(self, name: str) -> None:
        base = f"{PREFIX}:taskset:{{{name}}}"
        self.spec = f"{base}:spec"
        self.cursor = f"{base}:cursor"
        self.leases = f"{base}:leases"
        self.owners = f"{base}:owners"
        self.completed = f"{base}:completed"
        self.failed = f"{base}:failed"
        self.pass_rates = f"{base}:pass"
        self.lock = f"{base}:lock"

    def used(self, epoch: int) -> str:
        return f"{self.spec.removesuffix(':spec')}:used:{epoch}"

    def all(self) -> list[str]:
        return [
            self.spec,
            self.cursor,
            self.leases,
            self.owners,
            self.completed,
            self.failed,
            self.pass_rates,
            self.lock,
        ]


class MixtureKeys:
    def __init__(self, name: str) -> None:
        base = f"{PREFIX}:mixture:{{{name}}}"
        self.spec = f"{base}:spec"
        self.draws = f"{base}:draws"  # the draw counter: every replica and consumer draws from one sequence

    def all(self) -> list[str]:
        return [self.spec, self.draws]
