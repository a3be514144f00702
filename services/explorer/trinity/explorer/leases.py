"""Keeping an explore step's task leases alive while its rollouts run (RenewTaskLeases).

A rollout may outlive its task's `lease_seconds` (long multi-turn episodes, a slow engine); without renewal
the Buffer hands the task to another explorer while this one still works on it. The keeper renews every
`lease_seconds / 3`, so two renewals in a row may fail (a Buffer restart) before a lease can expire.

A lost lease (the task was re-leased elsewhere or completed) is logged and counted, and its rollout's results
are still put: delivery is at least once (docs/buffer.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType

from trinity.clients import BufferClient
from trinity.explorer.metrics import LEASES_LOST
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.v1 import common_pb2

log = get_logger(__name__)


class LeaseKeeper:
    """`with LeaseKeeper(...) as leases:` renews `tasks`' leases until the block ends; `leases.lost` names the
    task ids whose leases were lost meanwhile."""

    def __init__(
        self,
        buffer: BufferClient,
        taskset: str,
        consumer: str,
        tasks: Sequence[common_pb2.Task],
        lease_seconds: float,
    ) -> None:
        self.buffer = buffer
        self.taskset = taskset
        self.consumer = consumer
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        self._held = {t.lease_id: t.id for t in tasks}  # lease id -> task id
        self.lost: list[str] = []  # task ids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while self._held and not self._stop.wait(self.interval):
            try:
                reply = self.buffer.renew_task_leases(self.taskset, self.consumer, list(self._held), self.lease_seconds)
            except Exception as err:  # noqa: BLE001 - the next renewal tries again; the lease has time left
                log.warning("leases.renew_failed", taskset=self.taskset, error=one_line(err))
                continue
            if reply.lost:
                lost = [self._held.pop(lease_id) for lease_id in reply.lost if lease_id in self._held]
                self.lost += lost
                LEASES_LOST.inc(len(lost))
                log.warning("leases.lost", taskset=self.taskset, task_ids=lost)
