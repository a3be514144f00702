"""The run lifecycle: validate, prepare the Buffer, assign services, follow events, finish or fail.

All run state lives in Redis (RunStore); a restarted gateway picks the runs up where they were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

from trinity.clients import BufferClient
from trinity.config import RunConfig, naming, parse_run_config
from trinity.config.errors import ConfigError
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import TERMINAL, RunStore
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.client import open_channel
from trinity.runtime.errors import FailedPrecondition, InvalidArgument
from trinity.runtime.logging import get_logger
from trinity.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc, gateway_pb2, trainer_pb2_grpc

log = get_logger(__name__)

RUNNING = gateway_pb2.RUN_STATE_RUNNING
ROLE_EXPLORER, ROLE_TRAINER = "explorer", "trainer"
EVAL_EPOCHS = 1_000_000


def roles_for(config: RunConfig) -> dict[str, int]:
    """How many instances of each role a run's mode needs."""
    explorers = config.explorer.num_workers if config.mode in ("both", "explore", "bench", "serve") else 0
    trainers = 1 if config.mode in ("both", "train") else 0
    return {ROLE_EXPLORER: explorers, ROLE_TRAINER: trainers}


class Orchestrator:
    def __init__(
        self,
        runs: RunStore,
        registry: InstanceRegistry,
        sync_groups: SyncGroups,
        *,
        address: str,
        assign_timeout: float = 600.0,
    ) -> None:
        self.runs = runs
        self.registry = registry
        self.sync_groups = sync_groups
        self.address = address
        self.assign_timeout = assign_timeout
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- public operations ----------------------------------------------------------------------

    def create_run(self, config_text: str, run_id: str = "") -> gateway_pb2.Run:
        try:
            config = parse_run_config(config_text)
            config.stage_configs()  # stage overlays must validate too, before anything starts
        except ConfigError as err:
            raise InvalidArgument("", f"invalid run config: {err}") from None
        run = self.runs.create(config.name, config.model_dump_json(), run_id)
        self.event(run.id, "state", message="run accepted", state=gateway_pb2.RUN_STATE_PENDING)
        self._spawn(self._launch, run.id)
        return run

    def cancel(self, run_id: str, reason: str = "cancelled") -> gateway_pb2.Run:
        run = self.runs.get(run_id)
        if run.state in TERMINAL:
            return run
        self._stop_services(run, explorer_pb2.STOP_REASON_CANCELLED, reason)
        return self._finish(run_id, gateway_pb2.RUN_STATE_CANCELLED, reason)

    def report(self, event: gateway_pb2.RunEvent) -> tuple[str, bool]:
        """Record a service's event and move the run along (progress, completion, failure)."""
        run = self.runs.get(event.run_id)
        if run.state in TERMINAL:
            return "", False
        seq = self.runs.append_event(event)
        with self._lock:
            run = self.runs.get(event.run_id)
            if event.kind == "train":
                run.train_step = max(run.train_step, event.step)
            elif event.kind == "explore":
                run.explore_step = max(run.explore_step, event.step)
            if event.model_version > run.model_version:
                run.model_version = event.model_version
            for key, value in event.metrics.items():
                run.latest_metrics[f"{event.kind}/{key}"] = value
            self.runs.save(run)
        if event.kind == "error":
            self._spawn(self._fail, run.id, f"{event.source}: {event.message}")
        elif event.kind == "finished":
            self._spawn(self._on_finished, run.id, event.source.partition("/")[2], event.final_model_path)
        return seq, True

    def event(
        self,
        run_id: str,
        kind: str,
        *,
        message: str = "",
        state: gateway_pb2.RunState = gateway_pb2.RUN_STATE_UNSPECIFIED,
        metrics: dict[str, float] | None = None,
    ) -> None:
        run = self.runs.get(run_id)
        self.runs.append_event(
            gateway_pb2.RunEvent(
                run_id=run_id,
                kind=kind,
                source="gateway",
                message=message,
                state=state,
                metrics=metrics or {},
                stage=run.stage,
                model_version=run.model_version,
                step=run.train_step,
            )
        )

    # ---- launching --------------------------------------------------------------------------------

    def _config(self, run: gateway_pb2.Run) -> RunConfig:
        """The config of the run's current stage; a later stage starts from the weights the last one
        produced unless it names a model itself."""
        base = RunConfig.model_validate_json(run.config_json)
        config = base.stage_configs()[run.stage]
        if run.stage > 0 and run.final_model_path and "path" not in base.stages[run.stage - 1].get("model", {}):
            config = config.model_copy(update={"model": config.model.model_copy(update={"path": run.final_model_path})})
        return config

    def _launch(self, run_id: str) -> None:
        try:
            run = self.runs.get(run_id)
            config = self._config(run)
            buffer = self._wait_for_instances(run_id, "buffer", 1)[0]
            self._prepare_buffer(run_id, run.stage, config, buffer.address)
            wanted = roles_for(config)
            explorers = self._wait_for_instances(run_id, ROLE_EXPLORER, wanted[ROLE_EXPLORER])
            trainers = self._wait_for_instances(run_id, ROLE_TRAINER, wanted[ROLE_TRAINER])
            with self._lock:
                run = self.runs.get(run_id)
                if run.state in TERMINAL:
                    return
                run.assignments.clear()
                del run.finished[:]
                for inst in explorers:
                    run.assignments[inst.instance_id] = ROLE_EXPLORER
                for inst in trainers:
                    run.assignments[inst.instance_id] = ROLE_TRAINER
                run.state = RUNNING
                self.runs.save(run)
            self.event(run_id, "state", message=f"stage {run.stage} running", state=RUNNING)
            # The trainer first: it reserves the sync group's rendezvous that explorers join.
            for inst in trainers + explorers:
                self._start_on(run, inst, buffer.address)
        except Exception as err:
            log.exception("run.launch_failed", run_id=run_id)
            self._fail(run_id, f"launch failed: {err}")

    def _wait_for_instances(self, run_id: str, service: str, count: int) -> list[gateway_pb2.Instance]:
        if count == 0:
            return []
        deadline = time.monotonic() + self.assign_timeout
        while True:
            run = self.runs.get(run_id)
            if run.state in TERMINAL:
                raise FailedPrecondition("run ended while waiting for services")
            busy = self._busy_instances(exclude_run=run_id)
            free = [i for i in self.registry.alive(service) if i.instance_id not in busy]
            if len(free) >= count:
                return free[:count]
            if time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"needs {count} live {service} instance(s), found {len(free)} within {self.assign_timeout:.0f}s"
                )
            time.sleep(0.2)

    def _busy_instances(self, exclude_run: str) -> set[str]:
        busy: set[str] = set()
        for run in self.runs.all():
            if run.id != exclude_run and run.state not in TERMINAL:
                busy.update(run.assignments)
        return busy

    def _prepare_buffer(self, run_id: str, stage: int, config: RunConfig, address: str) -> None:
        with BufferClient(address, timeout=600) as buffer:
            stream = config.buffer.experience_stream
            stream_name = naming.experience_stream(run_id, stage, stream.name)
            buffer.create_stream(stream.model_copy(update={"name": stream_name}), exist_ok=True)
            if config.buffer.taskset is not None:
                section = config.buffer.taskset
                spec = section.model_copy(update={"name": naming.taskset(run_id, stage, section.name)})
                buffer.create_taskset(spec, replace=False)
            for section in config.buffer.eval_tasksets:
                # Evaluation walks the whole set in order, once per evaluation: an endless sequential set.
                spec = section.model_copy(
                    update={
                        "name": naming.taskset(run_id, stage, section.name),
                        "epochs": EVAL_EPOCHS,
                        "selector": "sequential",
                    }
                )
                buffer.create_taskset(spec, replace=False)
            offline = config.buffer.offline_data
            if offline is not None and config.mode == "train":
                kind = (
                    common_pb2.EXPERIENCE_KIND_PREFERENCE
                    if config.algorithm.algorithm_type == "dpo"
                    else common_pb2.EXPERIENCE_KIND_SFT
                )
                reply = buffer.load_offline(stream_name, offline, kind)
                self.event(run_id, "log", message=f"loaded {reply.loaded} offline samples ({reply.skipped} skipped)")

    def _start_on(self, run: gateway_pb2.Run, instance: gateway_pb2.Instance, buffer_address: str) -> None:
        config = self._config(run)
        request = explorer_pb2.StartRunRequest(
            run_id=run.id,
            config_json=config.model_dump_json(),
            buffer_address=buffer_address,
            gateway_address=self.address,
            stage=run.stage,
        )
        with open_channel(instance.address) as channel:
            stub = _stub(instance.service, channel)
            stub.StartRun(request, timeout=60)
        instance.run_id = run.id
        self.registry.save(instance)
        self.event(run.id, "log", message=f"{instance.service} {instance.instance_id} started")

    # ---- completion ---------------------------------------------------------------------------------

    def _on_finished(self, run_id: str, instance_id: str, final_model_path: str) -> None:
        """A stage ends when every assigned instance has finished its part.

        The trainer finishing tells the explorers to wrap up (apply the last weights, evaluate,
        finish); every explorer finishing tells the trainer to drain the stream and finish.
        """
        with self._lock:
            run = self.runs.get(run_id)
            if run.state in TERMINAL:
                return
            if instance_id not in run.finished:
                run.finished.append(instance_id)
            if run.assignments.get(instance_id) == ROLE_TRAINER and final_model_path:
                run.final_model_path = final_model_path
            self.runs.save(run)
            assigned = dict(run.assignments)
            done = set(run.finished)
        trainers = [i for i, r in assigned.items() if r == ROLE_TRAINER]
        explorers = [i for i, r in assigned.items() if r == ROLE_EXPLORER]
        if all(i in done for i in assigned):
            self._next_stage_or_succeed(run_id)
        elif assigned.get(instance_id) == ROLE_TRAINER:
            self._call_stop([e for e in explorers if e not in done], explorer_pb2.STOP_REASON_TRAINING_FINISHED, run_id)
        elif trainers and all(e in done for e in explorers):
            self._call_stop([t for t in trainers if t not in done], explorer_pb2.STOP_REASON_INPUT_EXHAUSTED, run_id)

    def _next_stage_or_succeed(self, run_id: str) -> None:
        run = self.runs.get(run_id)
        if run.stage + 1 >= len(RunConfig.model_validate_json(run.config_json).stage_configs()):
            self._finish(run_id, gateway_pb2.RUN_STATE_SUCCEEDED, "all stages finished")
            return
        with self._lock:
            run = self.runs.get(run_id)
            run.stage += 1
            self.runs.save(run)
        model = self._config(run).model.path
        self.event(run_id, "state", message=f"stage {run.stage} starting from {model}", state=RUNNING)
        self._launch(run_id)

    def _fail(self, run_id: str, reason: str) -> None:
        run = self.runs.get(run_id)
        if run.state in TERMINAL:
            return
        self._stop_services(run, explorer_pb2.STOP_REASON_FAILED, reason)
        self._finish(run_id, gateway_pb2.RUN_STATE_FAILED, reason)

    def _finish(self, run_id: str, state: gateway_pb2.RunState, message: str) -> gateway_pb2.Run:
        with self._lock:
            run = self.runs.get(run_id)
            if run.state in TERMINAL:
                return run
            run.state = state
            if state == gateway_pb2.RUN_STATE_FAILED:
                run.error = message
            self.runs.save(run)
        self.event(run_id, "state", message=message, state=state)
        log.info("run.finished", run_id=run_id, state=gateway_pb2.RunState.Name(state), message=message)
        return run

    def _stop_services(self, run: gateway_pb2.Run, reason: explorer_pb2.StopReason, detail: str) -> None:
        self._call_stop(list(run.assignments), reason, run.id, detail)

    def _call_stop(
        self, instance_ids: list[str], reason: explorer_pb2.StopReason, run_id: str, detail: str = ""
    ) -> None:
        for instance_id in instance_ids:
            instance = self.registry.get(instance_id)
            if instance is None or not instance.alive:
                continue
            try:
                with open_channel(instance.address) as channel:
                    _stub(instance.service, channel).StopRun(
                        explorer_pb2.StopRunRequest(run_id=run_id, reason=reason, detail=detail), timeout=30
                    )
            except grpc.RpcError as err:
                log.warning("run.stop_failed", instance=instance_id, error=err.details())

    # ---- liveness -----------------------------------------------------------------------------------

    def start_monitor(self, interval: float = 0.5) -> None:
        self._spawn(self._monitor, interval)
        for run in self.runs.all():  # resume after a gateway restart
            if run.state == gateway_pb2.RUN_STATE_PENDING:
                self._spawn(self._launch, run.id)

    def stop(self) -> None:
        self._stop.set()

    def _monitor(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                for instance in self.registry.sweep():
                    self._on_instance_lost(instance)
                self._rejoin_replacements()
            except Exception:
                log.exception("monitor.sweep_failed")

    def _on_instance_lost(self, instance: gateway_pb2.Instance) -> None:
        """A dead explorer's tasks go back to the queue and the sync group is re-formed."""
        log.warning("instance.lost", instance=instance.instance_id, service=instance.service)
        for run in self.runs.all():
            if run.state in TERMINAL or instance.instance_id not in run.assignments:
                continue
            self.event(run.id, "log", message=f"{instance.service} {instance.instance_id} lost (no heartbeat)")
            buffers = self.registry.alive("buffer")
            if buffers and instance.service == ROLE_EXPLORER:
                with BufferClient(buffers[0].address) as buffer:
                    released = buffer.release_tasks(instance.instance_id)
                self.event(run.id, "log", message=f"re-leased {released} task(s) of {instance.instance_id}")
            group = self.sync_groups.close(run.id, 0)
            if group is not None:
                self.event(run.id, "weights", message=f"sync group generation {group.generation} closed")
            if instance.service == ROLE_TRAINER:
                self._spawn(self._fail, run.id, f"trainer {instance.instance_id} lost")

    def _rejoin_replacements(self) -> None:
        """A run that lost an explorer takes a free live one (a restarted explorer registers anew)."""
        for run in self.runs.all():
            if run.state != RUNNING:
                continue
            lost = [
                i
                for i, role in run.assignments.items()
                if role == ROLE_EXPLORER and i not in run.finished and not _alive(self.registry.get(i))
            ]
            if not lost:
                continue
            busy = self._busy_instances(exclude_run="")
            free = [i for i in self.registry.alive(ROLE_EXPLORER) if i.instance_id not in busy]
            buffers = self.registry.alive("buffer")
            for old, new in zip(lost, free, strict=False):
                with self._lock:
                    current = self.runs.get(run.id)
                    del current.assignments[old]
                    current.assignments[new.instance_id] = ROLE_EXPLORER
                    self.runs.save(current)
                self.event(run.id, "log", message=f"explorer {new.instance_id} replaces {old}")
                if buffers:
                    self._start_on(current, new, buffers[0].address)

    def _spawn(self, fn: Callable, *args: object) -> None:
        thread = threading.Thread(target=fn, args=args, daemon=True)
        thread.start()


def _alive(instance: gateway_pb2.Instance | None) -> bool:
    return instance is not None and instance.alive


def _stub(service: str, channel: grpc.Channel):
    if service == ROLE_EXPLORER:
        return explorer_pb2_grpc.ExplorerServiceStub(channel)
    if service == ROLE_TRAINER:
        return trainer_pb2_grpc.TrainerServiceStub(channel)
    raise ValueError(f"no run control for service {service!r}")
