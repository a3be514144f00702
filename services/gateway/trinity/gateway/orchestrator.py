"""The run lifecycle: validate, prepare the Buffer, assign services, follow events, heal, finish or fail.

All run state lives in Redis (RunStore); a restarted gateway picks the runs up where they were. One
monitor thread does the periodic work: it launches pending runs once their services are free (a pending
run holds no thread), declares silent instances lost, and replaces lost ones. A lost trainer or explorer
is replaced by the same instance id coming back (a supervisor restarted it) or by any free instance of
its service; a run fails only when that does not happen within `recovery_seconds`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from trinity.clients import BufferClient
from trinity.config import RunConfig, naming, parse_run_config
from trinity.config.errors import ConfigError
from trinity.config.preset_operators import applied_by_preset, stream_operators
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import TERMINAL, RunStore, now_ms
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.client import open_channel
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable, one_line
from trinity.runtime.logging import get_logger
from trinity.runtime.steering import EXPLORER_KNOBS, KNOBS, TRAINER_KNOBS, check_steering
from trinity.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc, gateway_pb2, trainer_pb2_grpc

log = get_logger(__name__)

PENDING, RUNNING = gateway_pb2.RUN_STATE_PENDING, gateway_pb2.RUN_STATE_RUNNING
ROLE_EXPLORER, ROLE_TRAINER = "explorer", "trainer"
EVAL_EPOCHS = 1_000_000
EXPLORING_MODES = ("both", "explore")  # the modes whose explorers run the explore loop that steering acts on


def roles_for(config: RunConfig) -> dict[str, int]:
    """How many instances of each role a run's mode needs."""
    explorers = config.explorer.num_workers if config.mode in ("both", "explore", "bench", "serve") else 0
    trainers = 1 if config.mode in ("both", "train", "serve") else 0  # serve trains on the sessions it records
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
        recovery_seconds: float = 300.0,
    ) -> None:
        self.runs = runs
        self.registry = registry
        self.sync_groups = sync_groups
        self.address = address
        self.assign_timeout = assign_timeout
        self.recovery_seconds = recovery_seconds
        self._lock = threading.RLock()
        self._stop = threading.Event()
        # Launching a run blocks on the buffer (task sets, offline data): a few at a time, off the monitor.
        self._launcher = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._launching: set[str] = set()
        self._monitor_thread: threading.Thread | None = None

    # ---- public operations ----------------------------------------------------------------------

    def create_run(self, config_text: str, run_id: str = "") -> gateway_pb2.Run:
        try:
            config = parse_run_config(config_text)
            config.stage_configs()  # stage overlays must validate too, before anything starts
        except ConfigError as err:
            raise InvalidArgument("", f"invalid run config: {err}") from None
        run = self.runs.create(config.name, config.model_dump_json(), run_id)
        self.event(run.id, "state", message="run accepted", state=PENDING)
        return run  # the monitor launches it once its services are free

    def cancel(self, run_id: str, reason: str = "cancelled") -> gateway_pb2.Run:
        run = self.runs.get(run_id)
        if run.state in TERMINAL:
            return run
        self._stop_services(run, explorer_pb2.STOP_REASON_CANCELLED, reason)
        return self._finish(run_id, gateway_pb2.RUN_STATE_CANCELLED, reason)

    def steer(self, run_id: str, steering: common_pb2.Steering) -> gateway_pb2.SteerRunResponse:
        """Forward each knob to the services that own it (the trainer first: it may refuse, and then nothing
        has changed) and record every change as a `steer` event."""
        knobs = check_steering(steering)
        run = self.runs.get(run_id)
        if run.state != RUNNING:
            state = gateway_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_")
            raise FailedPrecondition(f"run {run_id} is {state}; only a RUNNING run can be steered")
        config = self._config(run)
        _check_steerable(config, knobs)
        calls: list[tuple[str, common_pb2.Steering]] = []
        for role, owned in ((ROLE_TRAINER, TRAINER_KNOBS), (ROLE_EXPLORER, EXPLORER_KNOBS)):
            mine = [k for k in knobs if k in owned]
            if not mine:
                continue
            part = common_pb2.Steering()
            for knob in mine:
                setattr(part, knob, getattr(steering, knob))
            calls += [(i, part) for i, r in sorted(run.assignments.items()) if r == role and i not in run.finished]
        changes: list[common_pb2.SteerChange] = []
        try:
            for instance_id, part in calls:
                changes += self._steer_instance(run, instance_id, part)
        finally:  # what was applied before a failure is recorded all the same
            for change in changes:
                self.runs.append_event(
                    gateway_pb2.RunEvent(
                        run_id=run_id,
                        kind="steer",
                        source=change.source,
                        message=describe_change(change),
                        metrics={change.knob: change.new_value},
                        stage=run.stage,
                        step=run.train_step,
                        model_version=run.model_version,
                    )
                )
        applied = [k for k in KNOBS if any(c.knob == k for c in changes)]
        log.info("run.steered", run_id=run_id, applied=applied)
        return gateway_pb2.SteerRunResponse(applied=applied, changes=changes)

    def _steer_instance(
        self, run: gateway_pb2.Run, instance_id: str, steering: common_pb2.Steering
    ) -> list[common_pb2.SteerChange]:
        instance = self.registry.get(instance_id)
        if instance is None or not instance.alive or instance_id in run.lost_unix_ms:
            raise Unavailable(f"{run.assignments[instance_id]} {instance_id} is lost; steer again once it is replaced")
        try:
            with open_channel(instance.address) as channel:
                reply = _stub(instance.service, channel).Steer(
                    common_pb2.SteerRequest(run_id=run.id, steering=steering), timeout=30
                )
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                raise FailedPrecondition(f"{instance.service} {instance_id}: {err.details()}") from None
            raise Unavailable(f"{instance.service} {instance_id} did not apply it: {one_line(err)}") from None
        return list(reply.changes)

    def report(self, event: gateway_pb2.RunEvent) -> tuple[str, bool]:
        """Record a service's event and move the run along (progress, completion, failure)."""
        run = self.runs.get(event.run_id)
        if run.state in TERMINAL:
            return "", False
        seq, new = self.runs.append_once(event)
        if not new:
            return seq, True
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
        instance_id = event.source.partition("/")[2]
        if event.kind == "error":
            self._spawn(self._fail, run.id, f"{event.source}: {event.message}")
        elif event.kind == "finished":
            self._spawn(self._on_finished, run.id, instance_id, event.final_model_path)
        elif event.kind == "leaving":  # a draining service: hand its work on now, not after the liveness window
            self._spawn(self._lose, run.id, instance_id, "it is shutting down")
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

    def _schedule_pending(self, runs: list[gateway_pb2.Run]) -> None:
        """Launch the pending runs whose services are free; fail those that waited past `assign_timeout`."""
        for run in runs:
            if run.state != PENDING or run.id in self._launching:
                continue
            missing = self._missing(run, runs)
            if not missing:
                self._launching.add(run.id)
                self._launcher.submit(self._launch, run.id)
            elif now_ms() - run.created_unix_ms > self.assign_timeout * 1000:
                self._fail(run.id, f"no free services within {self.assign_timeout:.0f}s ({missing})")

    def _missing(self, run: gateway_pb2.Run, runs: list[gateway_pb2.Run]) -> str:
        """What the run still waits for ("1 trainer, 2 explorer"), or "" when every service it needs is free."""
        wanted = {"buffer": 1, **roles_for(self._config(run))}
        short = {s: n - len(self._free(s, run.id, runs)) for s, n in wanted.items()}
        return ", ".join(f"{n} {service}" for service, n in short.items() if n > 0)

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
        except _Stopping:
            return  # still pending: the next gateway launches it
        except Exception as err:
            log.exception("run.launch_failed", run_id=run_id)
            self._fail(run_id, f"launch failed: {one_line(err)}")
        finally:
            self._launching.discard(run_id)

    def _wait_for_instances(self, run_id: str, service: str, count: int) -> list[gateway_pb2.Instance]:
        if count == 0:
            return []
        deadline = time.monotonic() + self.assign_timeout
        while True:
            if self._stop.is_set():
                raise _Stopping
            run = self.runs.get(run_id)
            if run.state in TERMINAL:
                raise FailedPrecondition("run ended while waiting for services")
            free = self._free(service, run_id, self.runs.all())
            if len(free) >= count:
                return free[:count]
            if time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"needs {count} live {service} instance(s), found {len(free)} within {self.assign_timeout:.0f}s"
                )
            self._stop.wait(0.2)

    def _free(self, service: str, exclude_run: str, runs: list[gateway_pb2.Run]) -> list[gateway_pb2.Instance]:
        """Live instances of `service` that no active run but `exclude_run` has assigned."""
        busy = {i for r in runs if r.id != exclude_run and r.state not in TERMINAL for i in r.assignments}
        return [i for i in self.registry.alive(service) if i.instance_id not in busy]

    def _prepare_buffer(self, run_id: str, stage: int, config: RunConfig, address: str) -> None:
        with BufferClient(address, timeout=600) as buffer:
            stream = config.buffer.experience_stream
            stream_name = naming.experience_stream(run_id, stage, stream.name)
            operators = stream_operators(config)
            buffer.create_stream(stream.model_copy(update={"name": stream_name, "operators": operators}), exist_ok=True)
            added = applied_by_preset(config)
            if added:
                names = ", ".join(op.name for op in added)
                self.event(run_id, "log", message=f"{config.algorithm.algorithm_type} applies data operators: {names}")
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

    def _start_on(
        self, run: gateway_pb2.Run, instance: gateway_pb2.Instance, buffer_address: str, *, replacing: bool = False
    ) -> None:
        """StartRun on `instance`; a replacement continues the run's weight versions (a new stage starts at 0)."""
        config = self._config(run)
        request = explorer_pb2.StartRunRequest(
            run_id=run.id,
            config_json=config.model_dump_json(),
            buffer_address=buffer_address,
            gateway_address=self.address,
            stage=run.stage,
            resume_model_version=self._newest_version(run) if replacing else 0,
        )
        with open_channel(instance.address) as channel:
            stub = _stub(instance.service, channel)
            stub.StartRun(request, timeout=60)
        instance.run_id = run.id
        self.registry.save(instance)
        self.event(run.id, "log", message=f"{instance.service} {instance.instance_id} started")

    def _newest_version(self, run: gateway_pb2.Run) -> int:
        """The newest weight version the run has reported or announced (a trainer may die between the two)."""
        try:
            announced = self.sync_groups.get(run.id).announced_version
        except NotFound:
            announced = -1
        return max(run.model_version, announced)

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

    # ---- liveness and healing ---------------------------------------------------------------------

    def start_monitor(self, interval: float = 0.5) -> None:
        self._monitor_thread = threading.Thread(target=self._monitor, args=(interval,), name="monitor", daemon=True)
        self._monitor_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the monitor and wait for it (and for launches under way), so that nothing still calls Redis
        or the services while the process exits."""
        self._stop.set()
        if self._monitor_thread is not None:
            self._monitor_thread.join(timeout)
        self._launcher.shutdown(wait=True, cancel_futures=True)

    def _monitor(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                for instance in self.registry.sweep():
                    self._on_instance_lost(instance, "no heartbeat")
                runs = self.runs.all()  # one read per sweep; a launch or a replacement re-reads what it changes
                self._recover(runs)
                self._schedule_pending(runs)
            except Exception:
                log.exception("monitor.sweep_failed")

    def on_registered(self, previous: gateway_pb2.Instance | None) -> None:
        """A new process registered under a known instance id: the incarnation it replaced is lost."""
        if previous is not None and previous.alive:
            self._spawn(self._on_instance_lost, previous, "its process was replaced")

    def _on_instance_lost(self, instance: gateway_pb2.Instance, why: str) -> None:
        log.warning("instance.lost", instance=instance.instance_id, service=instance.service, why=why)
        for run in self.runs.all():
            if run.state not in TERMINAL and instance.instance_id in run.assignments:
                self._lose(run.id, instance.instance_id, why)

    def _lose(self, run_id: str, instance_id: str, why: str) -> None:
        """Take a lost instance's work back (leased tasks, the batch it read) and wait for a replacement."""
        with self._lock:
            run = self.runs.get(run_id)
            role = run.assignments.get(instance_id)
            if run.state in TERMINAL or role is None or instance_id in run.finished or instance_id in run.lost_unix_ms:
                return
            run.lost_unix_ms[instance_id] = now_ms()
            self.runs.save(run)
        self.event(run_id, "log", message=f"{role} {instance_id} lost ({why})")
        try:
            self._hand_back(run, instance_id, role)
        except grpc.RpcError as err:  # the buffer is down too: the replacement reclaims them itself
            log.warning("run.hand_back_failed", run_id=run_id, instance=instance_id, error=one_line(err))
        group = self.sync_groups.close(run_id, 0)
        if group is not None:
            self.event(run_id, "weights", message=f"sync group generation {group.generation} closed")

    def _hand_back(self, run: gateway_pb2.Run, instance_id: str, role: str) -> None:
        buffers = self.registry.alive("buffer")
        if not buffers:
            return
        with BufferClient(buffers[0].address) as buffer:
            if role == ROLE_EXPLORER:
                released = buffer.release_tasks(instance_id)
                self.event(run.id, "log", message=f"re-leased {released} task(s) of {instance_id}")
            else:
                stream = naming.experience_stream(run.id, run.stage, self._config(run).buffer.experience_stream.name)
                requeued = buffer.nack(stream, instance_id, all_pending=True)
                self.event(run.id, "log", message=f"handed back {requeued} untrained experience(s) of {instance_id}")

    def _recover(self, runs: list[gateway_pb2.Run]) -> None:
        """Give each lost assignment of a running run a replacement, or fail the run past the deadline."""
        for run in runs:
            if run.state != RUNNING or not run.lost_unix_ms:
                continue
            for old, lost_ms in sorted(run.lost_unix_ms.items()):
                role = run.assignments[old]
                if role == ROLE_EXPLORER and self._training_done(run):
                    self._retire(run.id, old)  # nothing left for it to explore
                    continue
                replacement = self._replacement_for(old, role)
                if replacement is not None:
                    self._replace(run.id, old, replacement)
                elif now_ms() - lost_ms > self.recovery_seconds * 1000:
                    self._fail(run.id, f"{role} {old} lost and not replaced within {self.recovery_seconds:.0f}s")
                    break

    def _replacement_for(self, old: str, role: str) -> gateway_pb2.Instance | None:
        """The same instance id back (a restarted process), else a free live instance of the service (read
        afresh: an earlier replacement in this sweep may have taken one)."""
        same = self.registry.get(old)
        if same is not None and same.alive:
            return same
        return next(iter(self._free(role, "", self.runs.all())), None)

    def _replace(self, run_id: str, old: str, new: gateway_pb2.Instance) -> None:
        buffers = self.registry.alive("buffer")
        if not buffers:
            return  # the buffer is restarting: try again on the next sweep
        with self._lock:
            run = self.runs.get(run_id)
            role = run.assignments[old]
            del run.lost_unix_ms[old]
            del run.assignments[old]
            run.assignments[new.instance_id] = role
            self.runs.save(run)
        how = "restarted" if new.instance_id == old else f"replaces {old}"
        self.event(run_id, "log", message=f"{role} {new.instance_id} {how}")
        try:
            self._start_on(run, new, buffers[0].address, replacing=True)
        except grpc.RpcError as err:
            with self._lock:  # not started after all: lost again, the deadline still counting from before
                run = self.runs.get(run_id)
                run.lost_unix_ms[new.instance_id] = now_ms()
                self.runs.save(run)
            log.warning("run.replace_failed", run_id=run_id, instance=new.instance_id, error=one_line(err))
            return
        explorers = [i for i, r in run.assignments.items() if r == ROLE_EXPLORER]
        if role == ROLE_TRAINER and explorers and all(e in run.finished for e in explorers):
            self._call_stop([new.instance_id], explorer_pb2.STOP_REASON_INPUT_EXHAUSTED, run_id)

    def _training_done(self, run: gateway_pb2.Run) -> bool:
        trainers = [i for i, r in run.assignments.items() if r == ROLE_TRAINER]
        return bool(trainers) and all(t in run.finished for t in trainers)

    def _retire(self, run_id: str, instance_id: str) -> None:
        """Drop a lost explorer that is no longer needed, then see whether the stage is complete."""
        with self._lock:
            run = self.runs.get(run_id)
            del run.lost_unix_ms[instance_id]
            del run.assignments[instance_id]
            self.runs.save(run)
        self.event(run_id, "log", message=f"explorer {instance_id} not replaced: training has finished")
        if all(i in run.finished for i in run.assignments):
            self._next_stage_or_succeed(run_id)

    def _spawn(self, fn: Callable, *args: object) -> None:
        thread = threading.Thread(target=fn, args=args, daemon=True)
        thread.start()


def _check_steerable(config: RunConfig, knobs: list[str]) -> None:
    """FAILED_PRECONDITION for a knob the run's mode has no service (or no loop) to apply."""
    if "temperature" in knobs and config.mode == "serve":
        raise FailedPrecondition("steering.temperature: a serve-mode run samples as its clients ask, per request")
    explorer = [k for k in knobs if k in EXPLORER_KNOBS]
    if explorer and config.mode not in EXPLORING_MODES:
        raise FailedPrecondition(f"steering.{explorer[0]}: a run of mode {config.mode!r} does not explore")
    trainer = [k for k in knobs if k in TRAINER_KNOBS]
    if trainer and not roles_for(config)[ROLE_TRAINER]:
        raise FailedPrecondition(f"steering.{trainer[0]}: a run of mode {config.mode!r} has no trainer")


def describe_change(change: common_pb2.SteerChange) -> str:
    """`learning_rate 1e-06 -> 5e-06`; the pause as words (`exploration paused`)."""
    if change.knob == "pause_exploration":
        return "exploration paused" if change.new_value else "exploration resumed"
    return f"{change.knob} {change.old_value:g} -> {change.new_value:g}"


class _Stopping(Exception):
    """This gateway is shutting down: a launch waiting for services leaves its run as it is."""


def _stub(service: str, channel: grpc.Channel):
    if service == ROLE_EXPLORER:
        return explorer_pb2_grpc.ExplorerServiceStub(channel)
    if service == ROLE_TRAINER:
        return trainer_pb2_grpc.TrainerServiceStub(channel)
    raise ValueError(f"no run control for service {service!r}")
