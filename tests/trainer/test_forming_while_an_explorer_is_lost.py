"""The trainer forming a sync group while the gateway recovers a lost explorer (a partitioned or restarting explorer
host): it waits as long as the gateway does, gives the explorer that is back the whole timeout to join, and stops
with the run. Against a scripted gateway, so that the timings are the test's (`synchronizer.timeout_seconds` 0.3 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trinity.config import SynchronizerConfig
from trinity.trainer.weight_publisher import FormingStopped, WeightPublisher
from trinity.v1 import gateway_pb2

TIMEOUT_S = 0.3
EXPLORER = "explorer-0"


class ScriptedGateway:
    """The gateway's answers over time: the explorer lost until `back_at`, in the group from `joins_at` (seconds
    after the first open), the run in `state`."""

    def __init__(self, tmp_path: Path, *, back_at: float, joins_at: float, state: int = gateway_pb2.RUN_STATE_RUNNING):
        self.tmp_path, self.back_at, self.joins_at, self.state = tmp_path, back_at, joins_at, state
        self.started = 0.0
        self.run_queries = 0

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def open_sync_group(self, request: gateway_pb2.OpenSyncGroupRequest) -> gateway_pb2.SyncGroup:
        self.started = self.started or time.monotonic()
        return self.sync_group(request.run_id)

    def sync_group(self, run_id: str) -> gateway_pb2.SyncGroup:
        trainer = gateway_pb2.SyncMember(instance_id="trainer-0", rank=0)
        members = [trainer]
        if self._elapsed() >= self.joins_at:
            members.append(gateway_pb2.SyncMember(instance_id=EXPLORER, rank=1))
        return gateway_pb2.SyncGroup(
            run_id=run_id,
            generation=1,
            backend="checkpoint",
            world_size=2,
            members=members,
            ready=len(members) == 2,
            checkpoint_dir=str(self.tmp_path),
            timeout_seconds=TIMEOUT_S,
            bucket_mb=64,
        )

    def get_run(self, run_id: str) -> gateway_pb2.Run:
        self.run_queries += 1
        run = gateway_pb2.Run(id=run_id, state=self.state, assignments={EXPLORER: "explorer", "trainer-0": "trainer"})
        if self._elapsed() < self.back_at:
            run.lost_unix_ms[EXPLORER] = 1
        return run


def _publisher(gateway: ScriptedGateway, tmp_path: Path) -> WeightPublisher:
    return WeightPublisher(
        gateway,  # type: ignore[arg-type]
        run_id="run-1",
        instance_id="trainer-0",
        explorers=1,
        config=SynchronizerConfig(method="checkpoint", timeout_seconds=TIMEOUT_S),
        host="127.0.0.1",
        checkpoint_dir=str(tmp_path),
    )


def test_the_trainer_waits_for_a_lost_explorer_past_the_sync_timeout(tmp_path):
    # Lost past the first timeout (asked at 0.3 s, then each second), seen back at 1.3 s, in the group at 1.5 s:
    # a timeout after its return, long after the first deadline.
    gateway = ScriptedGateway(tmp_path, back_at=0.5, joins_at=1.5)
    publisher = _publisher(gateway, tmp_path)
    started = time.monotonic()
    publisher.open()
    publisher.close()
    assert time.monotonic() - started >= 1.5 and gateway.run_queries == 2


def test_an_explorer_that_is_back_but_never_joins_fails_forming_after_the_timeout(tmp_path):
    gateway = ScriptedGateway(tmp_path, back_at=0.5, joins_at=1e9)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0 of 1 explorer worker\(s\).*synchronizer.timeout_seconds"):
        _publisher(gateway, tmp_path).open()
    # Asked at 0.3 s (lost) and at 1.3 s (back): the explorer then has one more timeout.
    assert 1.3 + TIMEOUT_S <= time.monotonic() - started < 1.3 + TIMEOUT_S + 1.0


def test_no_explorer_lost_fails_forming_at_the_timeout(tmp_path):
    gateway = ScriptedGateway(tmp_path, back_at=0.0, joins_at=1e9)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _publisher(gateway, tmp_path).open()
    assert time.monotonic() - started < TIMEOUT_S + 1.0


def test_a_run_found_over_while_waiting_ends_the_forming(tmp_path):
    gateway = ScriptedGateway(tmp_path, back_at=1e9, joins_at=1e9, state=gateway_pb2.RUN_STATE_FAILED)
    with pytest.raises(FormingStopped, match="RUN_STATE_FAILED"):
        _publisher(gateway, tmp_path).open()
