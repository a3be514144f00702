"""The trainer's part of a run: read experiences, train, commit, acknowledge, publish weights.

Commit before acknowledge: with checkpoints enabled (`save_interval`), a batch's entries are
acknowledged only after a checkpoint that contains its update is on disk, so a crash in between
redelivers them and the checkpoint's consumed ids decide whether they were already trained.

A replacement trainer resumes from the newest checkpoint, takes back what its predecessor held
unacknowledged (the gateway hands it back; the same instance id restarted takes its own), and numbers
its weights after the newest version the run has seen. SIGTERM drains: the step in progress finishes,
a checkpoint is written, what was read but not trained goes back to the stream, and the trainer reports
`leaving` (never `finished`), so the gateway hands the run to a replacement at once.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch

from trinity.clients import BufferClient, GatewayClient
from trinity.clients.gateway import RunReporter
from trinity.config import RunConfig, TorchTrainerConfig, naming
from trinity.config.modes import ONLINE_MODES
from trinity.models import BUILTIN_MODELS, resolve_model_path
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.runtime.run_host import ReportingRunner
from trinity.runtime.spans import now_ms
from trinity.trainer.backend import TrainerBackend
from trinity.trainer.consistency import breaches
from trinity.trainer.expert_data import ExpertStream, uses_expert_data
from trinity.trainer.metrics import record_step
from trinity.trainer.parallel import resolve_device
from trinity.trainer.ranks import ReplicatedBackend, build_run_backend
from trinity.trainer.timeline import record_train_step
from trinity.trainer.weight_publisher import FormingStopped, WeightPublisher
from trinity.v1 import common_pb2, explorer_pb2, gateway_pb2

log = get_logger(__name__)


def run_dir(config: RunConfig, run_id: str) -> Path:
    root = config.checkpoint_dir or os.environ.get("TRINITY_RUNS_DIR") or str(Path.home() / ".cache/trinity/runs")
    return Path(root) / run_id


def with_model_dir(config: RunConfig) -> RunConfig:
    """The run config with `model.path` resolved to a model directory (`smollm2` is converted once)."""
    return config.model_copy(
        update={"model": config.model.model_copy(update={"path": resolve_model_path(config.model.path)})}
    )


class ConsistencyStop(RuntimeError):
    """A step's consistency probe passed a limit of `monitor.consistency` whose action is `stop`."""


class TrainerRunner(ReportingRunner):
    def __init__(
        self,
        *,
        run_id: str,
        stage: int,
        config: RunConfig,
        instance_id: str,
        buffer_address: str,
        gateway_address: str,
        advertise_host: str,
        resume_model_version: int = 0,
    ) -> None:
        self.run_id = run_id
        self.stage = stage
        self.config = config
        self.instance_id = instance_id
        self.buffer = BufferClient(buffer_address, timeout=120)
        self.gateway = GatewayClient(gateway_address, timeout=30)
        self.reporter = RunReporter(self.gateway, run_id, f"trainer/{instance_id}", stage)
        self.advertise_host = advertise_host
        self.resume_model_version = resume_model_version
        self.backend: TrainerBackend | None = None
        self.publisher: WeightPublisher | None = None
        self.state = "starting"
        self._stop = threading.Event()
        self._drain = threading.Event()
        self._leaving = False  # stopping because this process shuts down: the run goes on elsewhere
        self._unacked: dict[str, list[str]] = {}  # stream -> entries trained but not yet acknowledged
        self.expert: ExpertStream | None = None
        self._steer_lock = threading.Lock()
        self._next_lr: float | None = None  # a steered learning rate, applied before the next train step
        self._breached: set[str] = set()  # consistency limits past which the last step was (warned once)
        self._thread = threading.Thread(target=self._main, name=f"trainer-{run_id}", daemon=True)
        self.stage_dir = run_dir(config, run_id) / f"stage{stage}"
        self.stream = naming.experience_stream(run_id, stage, config.buffer.experience_stream.name)

    # ---- control ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: explorer_pb2.StopReason, detail: str = "") -> None:
        """Input exhausted: drain what is already in the stream; any other reason: stop after this step."""
        log.info("trainer.stopping", run_id=self.run_id, reason=explorer_pb2.StopReason.Name(reason), detail=detail)
        if reason == explorer_pb2.STOP_REASON_INPUT_EXHAUSTED:
            self._drain.set()
        else:
            # The run goes on elsewhere, or later (paused): checkpoint, no final export.
            self._leaving = reason in (explorer_pb2.STOP_REASON_SHUTDOWN, explorer_pb2.STOP_REASON_PAUSED)
            self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def steer_learning_rate(self, backend: TrainerBackend, lr: float) -> float:
        """Make `lr` the base learning rate from the next train step (the step in progress keeps its own);
        returns the rate it replaces. SteeringUnsupported from a backend that cannot."""
        with self._steer_lock:
            old = self._next_lr if self._next_lr is not None else backend.learning_rate
            self._next_lr = lr
        return old

    def _apply_steering(self, backend: TrainerBackend) -> None:
        with self._steer_lock:
            lr, self._next_lr = self._next_lr, None
        if lr is not None:
            backend.set_learning_rate(lr)
            log.info("trainer.learning_rate_set", run_id=self.run_id, lr=lr, step=self.step)

    @property
    def step(self) -> int:
        return self.backend.step if self.backend is not None else 0

    @property
    def model_version(self) -> int:
        return self.backend.model_version if self.backend is not None else 0

    # ---- the loop ---------------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            final = self._run()
            if final is None:
                self.state = "stopped"
                self._report(gateway_pb2.EVENT_KIND_LEAVING, message=f"trainer leaving; checkpoint at step {self.step}")
            else:
                self.state = "finished"
                self._report(
                    gateway_pb2.EVENT_KIND_FINISHED, message=f"final model: {final}", final_model_path=str(final)
                )
        except FormingStopped as stopped:  # the run ended elsewhere (it has reported why), or was paused
            log.info("trainer.stopped", run_id=self.run_id, detail=str(stopped))
            self.state = "stopped"
            if self._leaving:  # nothing trained since the checkpoint it resumed from: the gateway frees it
                self._report(gateway_pb2.EVENT_KIND_LEAVING, message=f"trainer leaving; checkpoint at step {self.step}")
        except Exception as err:
            log.exception("trainer.failed", run_id=self.run_id)
            self.state = "failed"
            self._report(gateway_pb2.EVENT_KIND_ERROR, message=one_line(err))
        finally:
            if self.publisher is not None:
                self.publisher.close()
            if isinstance(self.backend, ReplicatedBackend):
                self.backend.close()  # the followers leave and the process group goes: the next run makes its own
            self.buffer.close()

    def _run(self) -> Path | None:
        """Train to the end and export the final model; None when stopped by a shutdown (checkpointed)."""
        cfg = self.config
        threads = cfg.trainer.threads or int(os.environ.get("TRINITY_TRAINER_THREADS", "0"))
        if threads:
            torch.set_num_threads(threads)
        checkpoints = self.stage_dir / "checkpoints"
        model_config = self._with_model_dir()
        with self.reporter.phase(gateway_pb2.PHASE_MODEL_LOAD, step=0, model_version=0, detail=cfg.trainer.backend):
            backend = self.backend = build_run_backend(
                model_config, checkpoints, run_id=self.run_id, rank_secret=lambda: self.gateway.rank_secret(self.run_id)
            )
            self._resume(backend)
            # While the explorers build their engines, so that the first step does not pay it (docs/benchmarks.md).
            backend.warm_up()
        # The same instance id restarted: what this consumer held when it died is ours to train again.
        self.buffer.nack(self.stream, self.instance_id, all_pending=True)
        if uses_expert_data(cfg):
            self.expert = ExpertStream(self.buffer, cfg, self.run_id, self.stage, self.instance_id)
            loaded = self.expert.open()
            self._report(
                gateway_pb2.EVENT_KIND_LOG,
                message=f"mixing {self.expert.per_batch} demonstrations into each batch ({loaded} loaded)",
            )
        self.state = "running"
        if cfg.mode in ONLINE_MODES:  # explorers to feed: rollouts, or the served model
            self.publisher = WeightPublisher(
                self.gateway,
                run_id=self.run_id,
                instance_id=self.instance_id,
                explorers=cfg.explorer.num_workers,
                config=cfg.synchronizer,
                host=self.advertise_host,
                checkpoint_dir=str(self.stage_dir / "weights"),
                stop=self._stop,
                dtype=getattr(torch, cfg.engine_dtype),
                # Megatron's workers place themselves: the sync then sends from this process's own GPU (auto).
                device=resolve_device(cfg.trainer.device if isinstance(cfg.trainer, TorchTrainerConfig) else "auto"),
            )
            workers = f"{cfg.explorer.num_workers} explorer worker" + ("s" if cfg.explorer.num_workers > 1 else "")
            with self.reporter.phase(gateway_pb2.PHASE_SYNC_FORM, step=0, model_version=0, detail=workers):
                self.publisher.open()
        spans = self.reporter.spans
        try:
            self._train(backend)
        except FormingStopped:
            if not self._leaving:
                raise
            # Paused (or shutting down) while re-forming the sync group between steps: what it trained is
            # checkpointed below.
        with spans.timed(gateway_pb2.PHASE_CHECKPOINT, step=self.step, model_version=self.model_version):
            self._commit(backend, {}, checkpoint=True)  # the final state is a checkpoint too: resume continues from it
        if self._leaving:
            return None
        with spans.timed(gateway_pb2.PHASE_EXPORT, step=self.step, model_version=self.model_version):
            return backend.save_hf(self.stage_dir / "final")

    def _train(self, backend: TrainerBackend) -> None:
        """Train steps until the last, a stop, or the end of the input (draining)."""
        cfg, spans = self.config, self.reporter.spans
        while self.step < cfg.buffer.total_steps and not self._stop.is_set():
            reading = now_ms()
            batch = self._read_batch(backend)
            if batch is None:
                break
            step, version = self.step + 1, self.model_version  # the step this batch makes, the weights it trains
            spans.add(gateway_pb2.PHASE_READ_BATCH, step=step, model_version=version, start_ms=reading)
            entry_ids, experiences, dropped_stale = batch
            experts = sum(e.kind == common_pb2.EXPERIENCE_KIND_SFT for e in experiences)
            self._apply_steering(backend)
            started, training = time.perf_counter(), now_ms()
            metrics = backend.train_step(experiences)
            if metrics.get("skipped"):
                # Nothing new (all already trained, e.g. redelivered after a crash): they are in the
                # checkpoint already, so acknowledge them at once.
                self._ack(entry_ids)
                continue
            metrics["seconds"] = time.perf_counter() - started
            record_train_step(spans, training, now_ms(), metrics, step=step, model_version=version)
            metrics["dropped_stale"] = float(dropped_stale)
            if self.expert is not None:
                metrics["expert_samples"] = float(experts)
            self._commit(backend, entry_ids)
            if self.publisher is not None and self.step % cfg.synchronizer.sync_interval == 0:
                try:
                    with spans.timed(gateway_pb2.PHASE_PUBLISH_WEIGHTS, step=step, model_version=self.model_version):
                        metrics.update(self.publisher.publish(self.model_version, backend.named_weights))
                except FormingStopped:
                    if not self._leaving:
                        raise
                    # Paused (or shutting down) while the next generation formed: the step is reported and
                    # checkpointed as the loop ends; its weights go out with the first publish after a resume.
            record_step(metrics)
            self._report(gateway_pb2.EVENT_KIND_TRAIN, step=self.step, metrics=metrics)
            self._check_consistency(metrics)

    def _with_model_dir(self) -> RunConfig:
        """The run config with its model directory; a built-in model is converted on its first use here."""
        path = self.config.model.path
        if path not in BUILTIN_MODELS:
            return with_model_dir(self.config)
        with self.reporter.phase(gateway_pb2.PHASE_MODEL_CONVERT, step=0, model_version=0, detail=path):
            return with_model_dir(self.config)

    def _check_consistency(self, metrics: dict[str, float]) -> None:
        """Hold the step's probe against `monitor.consistency`: past a limit, a warning event (once, until the metric
        is back within it) or, with `action: stop`, the failure of the run, naming the metric and the limit."""
        limits = self.config.monitor.consistency
        problems = {line.partition(" ")[0]: line for line in breaches(metrics, limits)}
        new = [line for metric, line in problems.items() if metric not in self._breached]
        self._breached = set(problems)
        if not new:
            return
        line = f"train step {self.step}: " + "; ".join(new)
        if limits.action == "stop":
            raise ConsistencyStop(f"{line} (monitor.consistency.action: stop)")
        log.warning("trainer.consistency_warning", run_id=self.run_id, step=self.step, problems=new)
        self._report(gateway_pb2.EVENT_KIND_WARNING, message=f"{line} (warned once until it is back within the limit)")

    def _resume(self, backend: TrainerBackend) -> None:
        from trinity.trainer import checkpoint as ckpt

        root = self.stage_dir / "checkpoints"
        try:
            path = ckpt.resolve(root)
        except FileNotFoundError:
            path = None
        if path is not None:
            backend.load_checkpoint(path)
        backend.continue_versions_after(self.resume_model_version)
        if path is not None:
            self._report(
                gateway_pb2.EVENT_KIND_LOG,
                message=f"resumed from {path} at step {self.step}, version {self.model_version}",
            )

    def _read_batch(
        self, backend: TrainerBackend
    ) -> tuple[dict[str, list[str]], list[common_pb2.Experience], int] | None:
        """Exactly one train batch, or what is left when draining; None when there is nothing more.
        The entries read, by stream; with expert data, the batch's demonstrations follow its rollouts."""
        cfg = self.config
        want = cfg.train_batch_size
        staleness = cfg.synchronizer.max_staleness
        min_version = max(0, self.model_version - staleness) if staleness is not None else 0
        entry_ids: list[str] = []
        experiences: list[common_pb2.Experience] = []
        dropped = 0
        while len(experiences) < want and not self._stop.is_set():
            got = self.buffer.read(
                self.stream, self.instance_id, want - len(experiences), block_ms=1000, min_model_version=min_version
            )
            dropped += got.dropped_stale
            entry_ids += got.entry_ids
            experiences += got.experiences
            held = list(dict.fromkeys([*self._unacked.get(self.stream, []), *entry_ids]))  # an entry redelivered: once
            if got.consumer_pending > len(held):
                # Entries delivered to this trainer that never reached it (a read's reply lost with its connection)
                # would wait under its name until reclaimed (`claim_idle_ms`, 10 min): hand them back for the next.
                handed = self.buffer.nack(self.stream, self.instance_id, all_pending=True, keep=held)
                log.warning("trainer.deliveries_lost", run_id=self.run_id, handed_back=handed)
            if not got.experiences and self.publisher is not None and self.publisher.group_lost():
                # An explorer was lost: re-form the group and push the current version to its replacement.
                self.publisher.reform(self.model_version, backend.named_weights)
            if not got.experiences and self._drain.is_set():
                break
        read = {self.stream: entry_ids}
        if self.expert is not None and experiences and not self._stop.is_set():
            expert_ids, demonstrations = self.expert.read()
            read[self.expert.name] = expert_ids
            experiences += demonstrations
        if self._stop.is_set():
            for stream, ids in read.items():
                if ids:
                    self.buffer.nack(stream, self.instance_id, ids)  # read, not trained: back to the stream
            return None
        if not experiences:
            return None
        return read, experiences, dropped

    def _ack(self, entries: dict[str, list[str]]) -> None:
        for stream, ids in entries.items():
            if ids:
                self.buffer.ack(stream, ids)

    def _commit(self, backend: TrainerBackend, entries: dict[str, list[str]], *, checkpoint: bool = False) -> None:
        """Acknowledge once the update that used the entries is durable: the backend checkpoints every
        `save_interval` steps (with the consumed ids); without checkpoints, once the update is applied."""
        for stream, ids in entries.items():
            self._unacked.setdefault(stream, []).extend(ids)
        interval = self.config.trainer.save_interval
        if checkpoint:
            backend.save_checkpoint()
        elif interval and self.step % interval:
            self._renew()  # acknowledged with the next checkpoint
            return
        self._ack(self._unacked)
        self._unacked = {}

    def _renew(self) -> None:
        """Keep the trained, not yet acknowledged entries this trainer holds from being reclaimed: steps slower than
        `claim_idle_ms / save_interval` would otherwise see them redelivered before the checkpoint acknowledges them."""
        for stream, ids in self._unacked.items():
            held = self.buffer.renew(stream, self.instance_id, ids)
            if held < len(ids):  # reclaimed by another consumer meanwhile: it may train them too
                log.warning("trainer.entries_reclaimed", run_id=self.run_id, stream=stream, lost=len(ids) - held)
