"""The trainer's side of weight sync: reserve the rendezvous, open the group at the Gateway, publish.

A failed update (a member died mid-broadcast) closes the generation; the publisher re-forms the group
with whoever joins next and publishes the same version again, so a waiting explorer is never stranded. A
generation that fails to form (a member that cannot join, or does not prove it holds the generation's secret) is
closed the same way and the next one opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from trinity.clients.gateway import GatewayClient, sync_spec
from trinity.config import SynchronizerConfig
from trinity.runtime.agent import has_gpu
from trinity.runtime.logging import get_logger
from trinity.sync.placement import device_option, host_id, sync_gpus
from trinity.v1 import gateway_pb2

if TYPE_CHECKING:
    from trinity.sync.interface import SyncSender
    from trinity.sync.spec import Rendezvous

log = get_logger(__name__)

NamedTensors = Callable[[], Iterable[tuple[str, torch.Tensor]]]
_OVER = (gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED)


class FormingStopped(Exception):
    """The run was stopped while the trainer waited for explorers to join a generation."""


class WeightPublisher:
    def __init__(
        self,
        gateway: GatewayClient,
        *,
        run_id: str,
        instance_id: str,
        explorers: int,
        config: SynchronizerConfig,
        host: str,
        checkpoint_dir: str,
        max_attempts: int = 3,
        stop: threading.Event | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        """`dtype`: the explorers' engine dtype (`RunConfig.engine_dtype`); wider floating weights are cast to
        it before they are sent (`trinity.sync.narrowed_to`). None sends the trainer's dtypes as they are.
        `device`: the trainer's (`trainer.device` resolved): a GPU backend sends from it, and its GPU is the one
        reported to the Gateway. None: the current CUDA device."""
        self.gateway = gateway
        self.dtype = dtype
        self.device = device
        # Set when the run is stopped (failed elsewhere, cancelled): waiting for members then ends at once
        # instead of holding the trainer busy for up to `timeout_seconds`.
        self.stop = stop or threading.Event()
        self.run_id = run_id
        self.instance_id = instance_id
        # The explorers the config names: what a generation waits for only where the gateway does not know the run;
        # it sizes each generation by the run's explorers at the time (they join and leave: ScaleRun).
        self.explorers = explorers
        self.config = config
        self.host = host
        self.checkpoint_dir = checkpoint_dir
        self.max_attempts = max_attempts
        self.method = config.method
        self._rendezvous: Rendezvous | None = None
        self._sender: SyncSender | None = None
        self.generation = 0

    def open(self) -> SyncSender:
        """Open a new generation, wait until every explorer worker has joined it, and form it; its sender. Up to
        `max_attempts` generations: one that fails to form is reported (the Gateway closes it) and the next opened."""
        from trinity.sync import SyncError

        for attempt in range(1, self.max_attempts + 1):
            try:
                return self._form()
            except SyncError as err:
                log.warning("weights.forming_failed", generation=self.generation, attempt=attempt, error=str(err))
                self.gateway.report_sync_failure(self.run_id, self.generation, self.instance_id, str(err))
                self._close_sender()
                if attempt == self.max_attempts:
                    raise
        raise AssertionError("unreachable")

    def _form(self) -> SyncSender:
        from trinity.sync import SyncGroupSpec, open_sender, reserve_rendezvous

        collective = self.method != "checkpoint"
        if collective and self._rendezvous is None:
            placeholder = SyncGroupSpec.for_members(
                self.run_id.replace("/", "_")[:120],
                0,
                [f"explorer-{i}" for i in range(self.explorers)],
                host=self.host,
                port=0,
                timeout_s=self.config.timeout_seconds,
            )
            self._rendezvous = reserve_rendezvous(placeholder)
        group = self._open_generation()
        deadline = time.monotonic() + self.config.timeout_seconds
        recovering = False
        while not group.ready:
            if self.stop.is_set():
                raise FormingStopped(f"run {self.run_id} stopped while generation {group.generation} was forming")
            if time.monotonic() > deadline:
                # The gateway waits for a lost explorer to come back or be replaced, and bounds that wait itself
                # (TRINITY_RECOVERY_SECONDS: past it the run fails, which stops this wait): a partitioned or
                # restarting explorer host must not fail the run sooner than the gateway would. Asked each second
                # meanwhile, so that the explorer that is back gets the whole timeout to join from its return.
                if self._explorer_being_recovered():
                    recovering, deadline = True, time.monotonic() + 1.0
                elif recovering:
                    recovering, deadline = False, time.monotonic() + self.config.timeout_seconds
                else:
                    raise TimeoutError(
                        f"only {len(group.members) - 1} of {group.world_size - 1} explorer worker(s) joined the "
                        f"sync group within {self.config.timeout_seconds:.0f}s (synchronizer.timeout_seconds)"
                    )
            time.sleep(0.1)
            group = self.gateway.sync_group(self.run_id)
            if group.world_size == 0:
                # Closed while forming (a member of the last generation was declared lost after this one
                # opened): nobody can join it any more, so open the next.
                group = self._open_generation()
        spec = sync_spec(group)
        self.generation = group.generation
        options = {"rendezvous": self._rendezvous} if spec.is_collective else {}
        sender = self._sender = open_sender(spec, **options, **device_option(spec.backend, self.device))
        sender.init()
        log.info("weights.group_ready", generation=group.generation, backend=spec.backend)
        return sender

    def _explorer_being_recovered(self) -> bool:
        """Whether the gateway counts one of the run's explorers lost and is waiting for it or a replacement. A run
        found over ends the forming (the StopRun that says so may not have reached this trainer)."""
        run = self.gateway.get_run(self.run_id)
        if run.state in _OVER:
            raise FormingStopped(f"run {self.run_id} is {gateway_pb2.RunState.Name(run.state)}")
        return any(run.assignments.get(instance) == "explorer" for instance in run.lost_unix_ms)

    def _open_generation(self) -> gateway_pb2.SyncGroup:
        return self.gateway.open_sync_group(
            gateway_pb2.OpenSyncGroupRequest(
                run_id=self.run_id,
                instance_id=self.instance_id,
                host=self.host,
                port=self._rendezvous.port if self._rendezvous is not None else 0,
                has_gpu=has_gpu(),
                host_id=host_id(),
                gpu_uuids=sync_gpus(self.device),
                backend=self.method,
                explorer_workers=self.explorers,
                checkpoint_dir=self.checkpoint_dir,
                timeout_seconds=self.config.timeout_seconds,
                bucket_mb=self.config.bucket_mb,
            )
        )

    def group_lost(self) -> bool:
        """True when the Gateway closed our generation (a member died): it must be re-formed."""
        if self._sender is None:
            return False
        group = self.gateway.sync_group(self.run_id)
        return group.generation != self.generation or not group.ready

    def reform(self, version: int, named_tensors: NamedTensors) -> dict[str, float]:
        """Open a new generation and push the current weights, so a replacement explorer catches up."""
        log.info("weights.reforming", generation=self.generation, version=version)
        self._close_sender()
        self.open()
        return self.publish(version, named_tensors) if version > 0 else {}

    def publish(self, version: int, named_tensors: NamedTensors) -> dict[str, float]:
        """Push `version` to every explorer; re-form the group and retry when a member fails.

        Each attempt iterates `named_tensors()` once, bucket by bucket (from a sharded trainer every tensor
        is a fresh gather), casts each to the explorers' dtype; the sender digests what it sends in the same pass
        and sends the digest with the version, for the explorers to compare with what they load.
        """
        from trinity.sync import SyncError, narrowed_to

        if self.group_lost():
            # The membership changed (an explorer lost, joining or leaving): the gateway closed the generation, and
            # the next one, sized by the run's explorers now, takes this version.
            log.info("weights.reforming", generation=self.generation, version=version)
            self._close_sender()
        for attempt in range(1, self.max_attempts + 1):
            sender = self._sender or self.open()
            started = time.perf_counter()
            try:
                self.gateway.announce_weights(self.run_id, self.generation, version)
                weights = named_tensors() if self.dtype is None else narrowed_to(named_tensors(), self.dtype)
                report = sender.publish(version, weights)
            except SyncError as err:
                log.warning("weights.publish_failed", version=version, attempt=attempt, error=str(err))
                self.gateway.report_sync_failure(self.run_id, self.generation, self.instance_id, str(err))
                self._close_sender()
                if attempt == self.max_attempts:
                    raise
                continue
            if not report.accepted_by_all:
                raise SyncError(f"version {version} refused: {report.refused}")
            return {
                "weights_digest": float(report.digest or 0),
                "sync_seconds": time.perf_counter() - started,
                "sync_bytes": float(report.bytes),
                "sync_generation": float(self.generation),
                "sync_attempts": float(attempt),
            }
        raise AssertionError("unreachable")

    def _close_sender(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def close(self) -> None:
        self._close_sender()
        self._rendezvous = None
