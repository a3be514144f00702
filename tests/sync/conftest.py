"""Receiver processes for the sync tests: spawned children that join the group on loopback."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from tests.sync.workers import receiver_main
from trinity.sync import SyncGroupSpec


@dataclass
class Receivers:
    ctx: Any = field(default_factory=lambda: mp.get_context("spawn"))
    processes: list[BaseProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.results = self.ctx.Queue()
        self.control = self.ctx.Queue()

    def spawn(self, spec: SyncGroupSpec, plans: dict[int, list[str]], secret: bytes | None = None) -> None:
        """`secret`: the receivers' (the spec never carries one across a process boundary); default the spec's."""
        secret = secret if secret is not None else spec.secret_bytes
        for rank, plan in plans.items():
            process = self.ctx.Process(
                target=receiver_main, args=(spec.model_dump_json(), rank, plan, self.results, self.control, secret)
            )
            process.start()
            self.processes.append(process)

    def stop(self) -> None:
        for process in self.processes:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
                process.join()


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    group = Receivers()
    yield group
    group.stop()
