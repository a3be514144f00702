"""The explorer's side of weight sync: join the run's sync group and stage or stream each verified version.

A background thread receives. Staged (`synchronizer.explorer_receive: staged`): the whole version is received
and verified beside the rollouts (the trainer never waits for a rollout batch to finish) and the runner takes the
newest staged version between batches; the explorer holds a second copy of the model meanwhile. Streamed: each
verified chunk goes straight into the engine (`stream_into`), which holds its calls for the length of the
update, and the explorer's extra memory is about one chunk. After a failure the feed joins the next generation.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import torch

from trinity.clients.gateway import GatewayClient, sync_spec
from trinity.runtime.agent import has_gpu
from trinity.runtime.logging import get_logger
from trinity.runtime.spans import now_ms
from trinity.sync.placement import device_option, host_id, sync_gpus, worker_gpus
from trinity.v1 import gateway_pb2

if TYPE_CHECKING:
    from trinity.sync import SyncGroupSpec, SyncReceiver

log = get_logger(__name__)

IDLE_WAIT_S = 1.0


@dataclass(frozen=True)
class Staged:
    """A verified version waiting to be loaded."""

    version: int
    tensors: list[tuple[str, torch.Tensor]]
    published_digest: int | None  # the trainer's digest of what it sent; None from a sender that sent none
    received_ms: tuple[int, int] = (0, 0)  # unix ms: listening for it began (up to IDLE_WAIT_S early), it was in


StreamInto = Callable[[int, Iterator[tuple[str, torch.Tensor]], "SyncReceiver"], None]
"""`stream_into(version, named_tensors, receiver)`: load a version as its verified tensors arrive
(`trinity.sync.load_streamed`); `receiver.published_digest` is the sender's once the tensors are exhausted."""


@dataclass(frozen=True)
class WorkerRanks:
    """An engine whose workers are ranks of the group themselves (tensor parallel), each receiving every version."""

    ranks: int
    join: Callable[[SyncGroupSpec, int], None]
    """`join(spec, first_rank)`: every worker joins, as ranks first_rank.. (returns once the group has formed)."""
    leave: Callable[[], None]
    receive: Callable[[int], None]
    """`receive(version)`: the workers take the announced version; a transport failure is a `SyncError`."""


class WeightFeed:
    def __init__(
        self,
        gateway: GatewayClient,
        run_id: str,
        instance_id: str,
        device: torch.device | None = None,
        stream_into: StreamInto | None = None,
        workers: WorkerRanks | None = None,
    ) -> None:
        """`device`: the engine's (a GPU backend receives into it, and its GPU is the one reported to the Gateway);
        None: the current CUDA device. `stream_into`: load each version as it arrives instead of staging it.
        `workers`: the engine's workers are the ranks (neither staged nor streamed here)."""
        self.gateway = gateway
        self.device = device
        self.run_id = run_id
        self.instance_id = instance_id
        self.stream_into = stream_into
        self.workers = workers
        self.failure: BaseException | None = None
        """Why the feed stopped for good: a streamed load that failed in the engine (the runner raises it)."""
        self._staged: Staged | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="weight-feed", daemon=True)
        self.generation = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """After `close`: wait until the thread has left the group (at most one idle wait, `IDLE_WAIT_S`)."""
        self._thread.join(timeout)

    def take(self) -> Staged | None:
        """The newest verified version not yet taken, or None."""
        with self._lock:
            staged, self._staged = self._staged, None
            return staged

    def _loop(self) -> None:
        from trinity.sync import SyncError

        while not self._stop.is_set():
            try:
                group = self._join()
                if group is None:
                    return
                self.generation = group.generation
                log.info("weights.group_joined", generation=group.generation, rank=group.rank)
                if self.workers is not None:
                    self._serve_by_workers(group, self.workers)
                else:
                    self._serve(group)
            except SyncError as err:
                log.warning("weights.sync_failed", error=str(err), generation=self.generation)
                self._report_failure(str(err))
            except grpc.RpcError as err:
                log.warning("weights.gateway_error", error=err.details())
                self._stop.wait(1.0)
            except Exception as err:  # noqa: BLE001 - the engine failed a load in this thread: the runner raises it
                log.error("weights.load_failed", error=repr(err), generation=self.generation)
                self.failure = err
                return

    def _serve(self, group: gateway_pb2.SyncGroup) -> None:
        """This process is the engine's one rank: receive each version, and stage it or stream it into the engine;
        returns when the gateway ends the generation."""
        from trinity.sync import NoUpdateYet, open_receiver

        spec = sync_spec(group)
        receiver = open_receiver(spec, group.rank, **device_option(spec.backend, self.device))
        try:
            receiver.init()
            while not self._stop.is_set():
                listening = now_ms()
                try:
                    if self.stream_into is not None:
                        version, named = receiver.receive_streamed(idle_timeout_s=IDLE_WAIT_S)
                        self.stream_into(version, named, receiver)
                        continue
                    version, named = receiver.receive(idle_timeout_s=IDLE_WAIT_S)
                except NoUpdateYet:
                    if self._generation_current():
                        continue
                    # The gateway ended this generation (a member joined, left or was lost) before any update
                    # began: nothing failed, so nothing to report; join the next one at once.
                    log.info("weights.generation_ended", generation=self.generation)
                    return
                tensors = list(named)
                staged = Staged(version, tensors, receiver.published_digest, received_ms=(listening, now_ms()))
                with self._lock:
                    self._staged = staged
        finally:
            receiver.close()

    def _serve_by_workers(self, group: gateway_pb2.SyncGroup, workers: WorkerRanks) -> None:
        """The engine's workers are the ranks: they join, and take each version the trainer's doorbell announces
        (this process only watches the doorbell); returns when the gateway ends the generation."""
        from trinity.sync import NoUpdateYet
        from trinity.sync.collective import doorbell, wait_for_doorbell
        from trinity.sync.transport import open_store

        spec = sync_spec(group)
        workers.join(spec, group.rank)
        try:
            _, store = open_store(spec, group.rank)
            seq = 0
            while not self._stop.is_set():
                try:
                    wait_for_doorbell(store, seq + 1, spec, IDLE_WAIT_S)
                except NoUpdateYet:
                    if self._generation_current():
                        continue
                    log.info("weights.generation_ended", generation=self.generation)
                    return
                seq += 1
                workers.receive(int(store.get(doorbell(seq))))
        finally:
            with contextlib.suppress(Exception):  # the workers' receivers go with the generation, failed or not
                workers.leave()

    def _join(self):
        """Join the newest generation once the trainer has opened it, then wait until every member is in."""
        while not self._stop.is_set():
            try:
                group = self.gateway.join_sync_group(
                    self.run_id,
                    self.instance_id,
                    has_gpu(),
                    host_id=host_id(),
                    gpu_uuids=sync_gpus(self.device) if self.workers is None else worker_gpus(self.workers.ranks),
                    ranks=self.workers.ranks if self.workers is not None else 1,
                )
                while not group.ready and not self._stop.is_set():
                    time.sleep(0.1)
                    latest = self.gateway.sync_group(self.run_id)
                    if latest.generation != group.generation:
                        break  # re-formed meanwhile: join the new one
                    group.CopyFrom(latest)
                    group.rank = next(m.rank for m in latest.members if m.instance_id == self.instance_id)
                if group.ready:
                    return group
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                    raise
                time.sleep(0.2)  # no group yet, or a closed/full one: the trainer opens the next
        return None

    def _generation_current(self) -> bool:
        try:
            group = self.gateway.sync_group(self.run_id)
        except grpc.RpcError:
            return True
        return group.generation == self.generation and group.ready

    def _report_failure(self, error: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            self.gateway.report_sync_failure(self.run_id, self.generation, self.instance_id, error)
        self._stop.wait(0.5)
