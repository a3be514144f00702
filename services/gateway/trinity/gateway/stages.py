"""A run's stages: each starts on free services (the buffer prepared, each service started on its part) and ends when
all of them have finished their parts; then the next starts from the weights the last one exported, or the run
succeeds. Starting blocks on the buffer: launches run a few at a time in a pool of their own, never on the monitor."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from trinity.clients import BufferClient
from trinity.config import MixtureConfig, MixtureMember, RunConfig, naming
from trinity.config.modes import RunMode
from trinity.config.preset_operators import applied_by_preset, stream_operators
from trinity.gateway.ledger import ROLE_EXPLORER, ROLE_TRAINER, RUNNING, RunLedger, all_finished, unfinished
from trinity.gateway.queue import Plan, plan, roles_for
from trinity.gateway.runs import TERMINAL
from trinity.runtime.errors import FailedPrecondition, NotFound, one_line
from trinity.runtime.failpoints import failpoint
from trinity.runtime.logging import get_logger
from trinity.v1 import common_pb2, explorer_pb2, gateway_pb2

log = get_logger(__name__)

EVAL_EPOCHS = 1_000_000


class Stages:
    def __init__(self, ledger: RunLedger, assign_timeout: float) -> None:
        self.ledger = ledger
        self.assign_timeout = assign_timeout
        self.address = ""  # where services call the gateway back: known once its server has bound its port
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._launching: set[str] = set()
        # Of the pending runs at the last sweep: why each waited (said once), and since when each has been short of
        # live instances (unix ms; the clock of the pending timeout), among the runs looked at.
        self._waiting: dict[str, str] = {}
        self._short_since: dict[str, int] = {}
        self._looked_at: set[str] = set()

    def launching(self, run_id: str) -> bool:
        """Whether a launch of the run's stage is under way (its assignments are being made)."""
        return run_id in self._launching

    def plan(self, runs: list[gateway_pb2.Run]) -> Plan:
        """Who gets the free services now (trinity.gateway.queue)."""
        return plan(self.ledger, runs, self._launching)

    def schedule_pending(self, runs: list[gateway_pb2.Run]) -> None:
        """Launch the pending runs the queue lets start, say once why each other one waits, and fail one that has
        been short of live instances of a service (busy or not) for `assign_timeout`: a run that only waits its turn
        or for its tenant's quota waits on."""
        decided = self.plan(runs)
        for run_id in decided.start:
            self._launching.add(run_id)
            self.pool.submit(self.launch, run_id)
        for run_id, why in decided.waiting.items():
            if self._waiting.get(run_id) != why:
                self.ledger.note(run_id, why)
        self._waiting = decided.waiting
        now, short_since = self.ledger.clock(), {}
        for run in runs:
            if run.id not in decided.short:
                continue
            since = self._short_since.get(run.id)
            if since is None:  # short since it was queued, as far as this gateway knows, or since the last sweep
                since = now if run.id in self._looked_at else run.queued_unix_ms or run.created_unix_ms
            short_since[run.id] = since
            if now - since > self.assign_timeout * 1000:
                missing = decided.short[run.id]
                self.ledger.fail(run.id, f"no free services within {self.assign_timeout:.0f}s ({missing})")
        self._short_since = short_since
        self._looked_at = set(decided.waiting) | set(decided.short)

    def launch(self, run_id: str) -> None:
        """Start the run's current stage on free services; a launch that fails fails the run."""
        try:
            run = self.ledger.runs.get(run_id)
            config = self.ledger.stage_config(run)
            buffer = self._wait_for_instances(run_id, "buffer", 1)[0]
            self._prepare_buffer(run_id, run.stage, config, buffer.address, resuming=run.resuming)
            wanted = roles_for(config)
            explorers = self._wait_for_instances(run_id, ROLE_EXPLORER, wanted[ROLE_EXPLORER])
            trainers = self._wait_for_instances(run_id, ROLE_TRAINER, wanted[ROLE_TRAINER])
            with self.ledger.change(run_id) as run:
                if run.state in TERMINAL:
                    return
                run.assignments.clear()
                del run.finished[:], run.leaving[:]
                run.assignments.update({i.instance_id: i.service for i in explorers + trainers})
                run.state = RUNNING
            self.ledger.event(run_id, gateway_pb2.EVENT_KIND_STATE, message=f"stage {run.stage} running", state=RUNNING)
            # The trainer first: it reserves the sync group's rendezvous that explorers join. A resumed run's
            # services go on from its checkpoint and weight versions, as replacements do.
            for inst in trainers + explorers:
                self.start_on(run, inst, buffer.address, replacing=run.resuming)
        except Exception as err:
            if self.ledger.stopping.is_set():  # this gateway shuts down: the run stays pending for the next one
                return
            log.exception("run.launch_failed", run_id=run_id)
            self.ledger.fail(run_id, f"launch failed: {one_line(err)}")
        finally:
            self._launching.discard(run_id)

    def _wait_for_instances(self, run_id: str, service: str, count: int) -> list[gateway_pb2.Instance]:
        deadline = time.monotonic() + self.assign_timeout
        while count:
            if self.ledger.stopping.is_set() or self.ledger.runs.get(run_id).state in TERMINAL:
                raise FailedPrecondition("run ended (or the gateway stopped) while waiting for services")
            free = self.free(service, run_id, self.ledger.runs.all())
            if len(free) >= count:
                return free[:count]
            if time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"needs {count} live {service} instance(s), found {len(free)} within {self.assign_timeout:.0f}s"
                )
            self.ledger.stopping.wait(0.2)
        return []

    def free(self, service: str, exclude_run: str, runs: list[gateway_pb2.Run]) -> list[gateway_pb2.Instance]:
        """Live instances of `service` that no active run but `exclude_run` has assigned."""
        busy = {i for r in runs if r.id != exclude_run and r.state not in TERMINAL for i in r.assignments}
        return [i for i in self.ledger.registry.alive(service) if i.instance_id not in busy]

    def _prepare_buffer(self, run_id: str, stage: int, config: RunConfig, address: str, *, resuming: bool) -> None:
        """The stage's streams and task sets (kept as they are where they exist: a relaunch continues them), and its
        offline data, loaded once: not again when a paused run resumes."""
        with BufferClient(address, timeout=600) as buffer:
            stream = config.buffer.experience_stream
            stream_name = naming.experience_stream(run_id, stage, stream.name)
            operators = stream_operators(config)
            buffer.create_stream(stream.model_copy(update={"name": stream_name, "operators": operators}), exist_ok=True)
            added = applied_by_preset(config)
            if added:
                names = ", ".join(op.name for op in added)
                self.ledger.note(run_id, f"{config.algorithm.algorithm_type} applies data operators: {names}")
            train = config.buffer.train_tasksets
            for i, section in enumerate((*train, *config.buffer.eval_tasksets)):
                update: dict[str, object] = {"name": naming.taskset(run_id, stage, section.name)}
                if i >= len(train):  # evaluation walks the whole set in order, every time
                    update |= {"epochs": EVAL_EPOCHS, "selector": "sequential"}
                buffer.create_taskset(section.model_copy(update=update), replace=False)
            if len(train) > 1:  # one set is leased from directly: a mixture of one
                members = tuple(
                    MixtureMember(taskset=naming.taskset(run_id, stage, s.name), weight=s.weight) for s in train
                )
                mixing = config.buffer.mixing
                buffer.create_mixture(MixtureConfig(name=naming.mixture(run_id, stage), members=members, mixing=mixing))
            offline = config.buffer.offline_data
            if offline is not None and config.mode == RunMode.TRAIN and not resuming:
                kind = (
                    common_pb2.EXPERIENCE_KIND_PREFERENCE
                    if config.algorithm.preset.data_kind == "preference"
                    else common_pb2.EXPERIENCE_KIND_SFT
                )
                reply = buffer.load_offline(stream_name, offline, kind)
                self.ledger.note(run_id, f"loaded {reply.loaded} offline samples ({reply.skipped} skipped)")

    def start_on(
        self, run: gateway_pb2.Run, instance: gateway_pb2.Instance, buffer_address: str, *, replacing: bool = False
    ) -> None:
        """StartRun on `instance`; a replacement continues the run's weight versions (a new stage starts at 0)."""
        request = explorer_pb2.StartRunRequest(
            run_id=run.id,
            config_json=self.ledger.stage_config(run).model_dump_json(),
            buffer_address=buffer_address,
            gateway_address=self.address,
            stage=run.stage,
            resume_model_version=self._newest_version(run) if replacing else 0,
        )
        self.ledger.start_run(instance, request)
        instance.run_id, instance.stage = run.id, run.stage  # as its heartbeats will say from now on
        self.ledger.registry.save(instance)
        self.ledger.note(run.id, f"{instance.service} {instance.instance_id} started")

    def _newest_version(self, run: gateway_pb2.Run) -> int:
        """The newest weight version the run has reported or announced (a trainer may die between the two)."""
        try:
            return max(run.model_version, self.ledger.sync_groups.get(run.id).announced_version)
        except NotFound:  # no sync group yet
            return run.model_version

    def on_finished(self, run_id: str, instance_id: str, final_model_path: str) -> None:
        """The trainer finishing tells the explorers to wrap up (apply the last weights, evaluate, finish);
        every explorer finishing tells the trainer to drain the stream and finish."""
        with self.ledger.change(run_id) as run:
            if run.state in TERMINAL:
                return
            if instance_id not in run.finished:
                run.finished.append(instance_id)
            if run.assignments.get(instance_id) == ROLE_TRAINER and final_model_path:
                run.final_model_path = final_model_path
        if self.advance_if_done(run):
            return
        if run.assignments.get(instance_id) == ROLE_TRAINER:
            self.ledger.stop_run(unfinished(run, ROLE_EXPLORER), run_id, explorer_pb2.STOP_REASON_TRAINING_FINISHED)
        elif all_finished(run, ROLE_EXPLORER):
            self.ledger.stop_run(unfinished(run, ROLE_TRAINER), run_id, explorer_pb2.STOP_REASON_INPUT_EXHAUSTED)
        elif not all_finished(run, ROLE_TRAINER):
            # Its input ran out before the others': it receives no more weights, so the trainer's next publish goes
            # to a generation of the explorers still exploring, not one waiting for this one.
            self.ledger.close_generation(run_id, f"explorer {instance_id} finished")

    def advance_if_done(self, run: gateway_pb2.Run) -> bool:
        """Whether every assigned instance has finished the run's stage; then the next stage starts, or the run
        succeeds after its last."""
        if not _stage_done(run):
            return False
        if run.stage + 1 >= len(RunConfig.model_validate_json(run.config_json).stage_configs()):
            self.ledger.finish(run.id, gateway_pb2.RUN_STATE_SUCCEEDED, "all stages finished")
            return True
        self._launching.add(run.id)  # before the run shows no assignments, which `relaunch` would take up
        with self.ledger.change(run.id) as run:
            if run.state in TERMINAL or not _stage_done(run):  # ended, or advanced by a report beside this one
                self._launching.discard(run.id)
                return True
            # One write: a gateway that dies after it finds the next stage with nothing assigned (`relaunch`).
            run.stage += 1
            run.assignments.clear()
            del run.finished[:]
            run.explorers = 0  # a stage starts with the explorers its config names (ScaleRun scales one stage)
            del run.leaving[:]
            run.resuming = False  # a new stage starts afresh, whatever the last one went through
        starting = f"stage {run.stage} starting from {self.ledger.stage_config(run).model.path}"
        self.ledger.event(run.id, gateway_pb2.EVENT_KIND_STATE, message=starting, state=RUNNING)
        failpoint("gateway.stage")  # the ledger is in the next stage, whose services have not been started
        self.launch(run.id)
        return True

    def relaunch(self, runs: list[gateway_pb2.Run]) -> None:
        """Launch each running run that has nothing assigned: its stage began on a gateway that died before it
        started the stage's services."""
        for run in runs:
            if run.state != RUNNING or run.assignments:
                continue
            # Read afresh, then the launch set: a launch adds the run there before it empties its assignments
            # and leaves after it fills them, so an empty run outside the set is one nobody is launching.
            if self.ledger.runs.get(run.id).assignments or run.id in self._launching:
                continue
            self.ledger.note(run.id, f"stage {run.stage} was not started: starting it")
            self._launching.add(run.id)
            self.pool.submit(self.launch, run.id)


def _stage_done(run: gateway_pb2.Run) -> bool:
    """Whether the stage has instances and every one has finished its part."""
    return bool(run.assignments) and all(i in run.finished for i in run.assignments)
