"""What every explorer mode shares: the run, its config, the engine, the Buffer and Gateway clients,
the weight feed and the stop signal, behind public methods.

The modes (`rollout`, `bench`, `serve`) are peers built on this object; none imports another, and
none reaches into the runner that hosts them. Version discipline: new weights are staged by the
weight feed and swapped in only between engine calls (`apply_staged_weights`), so a batch never
mixes versions.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from trinity.clients import BufferClient, GatewayClient
from trinity.clients.gateway import RunReporter
from trinity.config import RunConfig, naming
from trinity.config.sync import resolve_explorer_receive
from trinity.explorer.engines.base import Engine, SamplingSettings
from trinity.explorer.metrics import DIGEST_MATCH, WEIGHT_VERSION
from trinity.explorer.rewards.judge_client import JudgeSettings, build_judge
from trinity.explorer.steering import Steering
from trinity.explorer.weight_feed import WeightFeed, WorkerRanks
from trinity.explorer.workflows import create_workflow
from trinity.explorer.workflows.base import RolloutSettings, Workflow
from trinity.explorer.workflows.routing import TaskWorkflows, workflow_for_run
from trinity.models.digest import weights_digest
from trinity.runtime.agent import has_gpu
from trinity.runtime.logging import get_logger
from trinity.runtime.run_host import ReportingRunner
from trinity.runtime.spans import now_ms
from trinity.v1 import gateway_pb2

if TYPE_CHECKING:
    import torch

    from trinity.sync import SyncReceiver

log = get_logger(__name__)

RUN_OVER = (gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED)
STAGED_POLL_S = 0.05

EngineFailure = Callable[[str], None]


@contextlib.contextmanager
def engine_guard(on_failure: EngineFailure | None) -> Iterator[None]:
    """An engine that fails to load or generate takes the service out of rotation (health
    NOT_SERVING) instead of leaving it up and useless."""
    try:
        yield
    except Exception as err:
        if on_failure is not None:
            on_failure(f"{type(err).__name__}: {err}")
        raise


class WeightsDigestMismatch(RuntimeError):
    """The weights an explorer loaded are not the ones published, and `monitor.consistency.action` is `stop`."""


def required_version(step: int, sync_interval: int, sync_offset: int) -> int:
    """The oldest weight version explore step `step` may use."""
    return max(0, ((step - sync_offset) // sync_interval) * sync_interval)


class ExplorerContext(ReportingRunner):
    """One explorer's share of a run, handed to the mode that runs it."""

    def __init__(
        self,
        *,
        run_id: str,
        stage: int,
        config: RunConfig,
        instance_id: str,
        engine: Engine,
        buffer: BufferClient,
        gateway: GatewayClient,
        reporter: RunReporter,
        stop: threading.Event,
        abandon: threading.Event | None = None,
        training_finished: threading.Event | None = None,
        on_engine_failure: EngineFailure | None = None,
        steering: Steering | None = None,
    ) -> None:
        self.run_id = run_id
        self.stage = stage
        self.config = config
        self.instance_id = instance_id
        self.engine = engine
        self.buffer = buffer
        self.gateway = gateway
        self.reporter = reporter
        self._stop = stop
        self._abandon = abandon or threading.Event()
        self._training_finished = training_finished or threading.Event()
        self.on_engine_failure = on_engine_failure
        # Pause and the rollout temperature, as the Steer RPC sets them (the runner owns it: a steer may come
        # while the engine still loads).
        self.steering = steering or Steering()
        self.feed: WeightFeed | None = None
        self.step = 0  # explore steps done (serve mode: feedback puts)
        self.openai_url = ""  # serve mode: the bound OpenAI endpoint while it runs

    # ---- the run ----------------------------------------------------------------------------------------

    @property
    def model_version(self) -> int:
        return self.engine.model_version

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def abandoned(self) -> bool:
        """Stopped with no wrap-up to do (final weights, final evaluation): the run was cancelled or failed,
        or this process shuts down and a replacement carries on."""
        return self._abandon.is_set()

    @property
    def training_finished(self) -> bool:
        """The trainer finished the run's last step while this explorer serves on
        (`explorer.keep_serving_after_last_step`): calls are answered, nothing more is trained."""
        return self._training_finished.is_set()

    def hold_while_paused(self) -> bool:
        """Wait while exploration is paused (Steer); False when the run stopped meanwhile."""
        return self.steering.hold_while_paused(self._stop)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when the run was stopped meanwhile."""
        return self._stop.wait(seconds)

    def report(
        self, kind: gateway_pb2.EventKind, *, step: int | None = None, message: str = "", metrics: dict | None = None
    ) -> None:
        """An event in the run's log (step defaults to the current one); a run over elsewhere stops this one."""
        self._report(kind, step=step, message=message, metrics=metrics)

    def timed(self, phase: gateway_pb2.Phase, *, detail: str = "") -> contextlib.AbstractContextManager[None]:
        """Time the block as a span of the explore step in progress; it rides on the step's explore event."""
        return self.reporter.spans.timed(phase, step=self.step + 1, model_version=self.model_version, detail=detail)

    def record(
        self, phase: gateway_pb2.Phase, start_ms: int, *, end_ms: int | None = None, version: int | None = None
    ) -> None:
        """A span of the explore step in progress that began at `start_ms` and ends at `end_ms` (now when None)."""
        version = self.model_version if version is None else version
        self.reporter.spans.add(phase, step=self.step + 1, model_version=version, start_ms=start_ms, end_ms=end_ms)

    def phase(self, phase: gateway_pb2.Phase, *, detail: str = "") -> contextlib.AbstractContextManager[None]:
        """A long phase (an evaluation after the steps done so far), announced as it begins and as it ends."""
        return self.reporter.phase(phase, step=self.step, model_version=self.model_version, detail=detail)

    def taskset(self, name: str) -> str:
        """The Buffer name of the run's task set `name` (as the config names it)."""
        return naming.taskset(self.run_id, self.stage, name)

    def train_tasks(self) -> str:
        """The Buffer name train tasks are leased from: the run's one train task set, or the mixture of several
        (whose tasks each name their own task set, `Task.taskset`)."""
        return naming.train_tasks(self.run_id, self.stage, [s.name for s in self.config.buffer.train_tasksets])

    def experience_stream(self) -> str:
        return naming.experience_stream(self.run_id, self.stage, self.config.buffer.experience_stream.name)

    # ---- rollouts ---------------------------------------------------------------------------------------

    @cached_property
    def workflow(self) -> Workflow:
        """The run's workflow, built on first use (serve mode has none)."""
        options = self.config.explorer.workflow_options
        kwargs = options if isinstance(options, dict) else options.model_dump()
        return create_workflow(self.config.explorer.workflow, **kwargs)

    @cached_property
    def task_workflows(self) -> TaskWorkflows:
        """What rollouts and evaluations run tasks with: each task's own workflow (`Task.workflow`, built with its
        default options), the run's `workflow` for a task that names none."""
        return TaskWorkflows(self.workflow, self.config.explorer.workflow, partial(workflow_for_run, self.config))

    @cached_property
    def judge(self) -> JudgeSettings | None:
        """The judge of the judge rewards (`explorer.judge`), connected or loaded on first use."""
        judge = self.config.explorer.judge
        return build_judge(judge, self.config.seed) if judge is not None else None

    def rollout_settings(self, temperature: float, repeat_times: int, *, evaluation: bool = False) -> RolloutSettings:
        """Sampling for one explore step's rollouts (a steered temperature replaces `temperature`), or, with
        `evaluation`, for an evaluation, which keeps its own temperature so that versions compare."""
        explorer = self.config.explorer
        if not evaluation:
            temperature = self.steering.temperature(temperature)
        sampling = SamplingSettings(
            temperature=temperature,
            top_p=explorer.top_p,
            top_k=explorer.top_k,
            max_tokens=self.config.model.max_response_tokens,
            stop=tuple(explorer.stop),
        )
        return RolloutSettings(
            repeat_times=repeat_times,
            sampling=sampling,
            reward_timeout_s=explorer.reward_timeout_seconds,
            run_id=self.run_id,
            judge=self.judge,
        )

    def engine_guard(self) -> contextlib.AbstractContextManager[None]:
        return engine_guard(self.on_engine_failure)

    # ---- weights ----------------------------------------------------------------------------------------

    def start_weight_feed(self) -> None:
        """Join the run's sync group in the background; versions are staged until applied, or streamed into the
        engine as they arrive (`synchronizer.explorer_receive`)."""
        ranks = self.engine.sync_ranks
        if ranks > 1:  # every engine worker a rank: each receives and loads its shard itself
            log.info("weights.receive_mode", run_id=self.run_id, explorer_receive="workers", ranks=ranks)
            engine: Any = self.engine
            workers = WorkerRanks(ranks, engine.join_sync_group, engine.leave_sync_group, self._load_by_workers)
            self.feed = WeightFeed(self.gateway, self.run_id, self.instance_id, workers=workers)
        else:
            receive = resolve_explorer_receive(self.config.synchronizer.explorer_receive, has_gpu())
            log.info("weights.receive_mode", run_id=self.run_id, explorer_receive=receive)
            stream_into = self._load_streamed if receive == "streamed" else None
            self.feed = WeightFeed(
                self.gateway, self.run_id, self.instance_id, device=self.engine.device, stream_into=stream_into
            )
        self.feed.start()

    def _load_by_workers(self, version: int) -> None:
        """The feed's thread: the engine's workers take `version` (calls held off meanwhile); a worker's failure is a
        `SyncError` (the feed reports it and joins the next generation)."""
        started, loading = time.perf_counter(), now_ms()
        loaded, published = self.engine.receive_version(version)  # type: ignore[attr-defined]
        self.record(gateway_pb2.PHASE_WEIGHT_LOAD, loading, version=version)
        self._loaded(version, time.perf_counter() - started, loaded, published)

    def _load_streamed(self, version: int, named: Iterator[tuple[str, torch.Tensor]], receiver: SyncReceiver) -> None:
        """The feed's thread: load a version as its verified chunks arrive (the engine holds calls meanwhile)."""
        from trinity.sync import load_streamed

        started, loading = time.perf_counter(), now_ms()
        loaded = load_streamed(version, named, self.engine.load_weights)
        # Received and loaded in one pass: the span runs from the update's first byte to the engine's last copy.
        self.record(gateway_pb2.PHASE_WEIGHT_LOAD, loading, version=version)
        self._loaded(version, time.perf_counter() - started, loaded, receiver.published_digest)

    def apply_staged_weights(self, wait_s: float = 0.0) -> None:
        """Swap in the newest staged version, waiting up to `wait_s` for one; reports a `weights` event."""
        if self.feed is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            staged = self.feed.take()
            if staged is not None:
                started, loading = time.perf_counter(), now_ms()
                received, arrived = staged.received_ms
                if received:
                    self.record(gateway_pb2.PHASE_WEIGHT_RECEIVE, received, end_ms=arrived, version=staged.version)
                self.engine.load_weights(staged.version, staged.tensors)
                self.record(gateway_pb2.PHASE_WEIGHT_LOAD, loading, version=staged.version)
                seconds = time.perf_counter() - started
                self._loaded(staged.version, seconds, weights_digest(staged.tensors), staged.published_digest)
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(STAGED_POLL_S)

    def _loaded(self, version: int, seconds: float, loaded: int, published: int | None) -> None:
        """Report a version the engine now serves; `published`: the trainer's digest of what it sent, against
        `loaded`, ours of what the engine loaded."""
        WEIGHT_VERSION.set(version)
        metrics = {"load_seconds": seconds, "weights_digest": float(loaded), "version": float(version)}
        if published is not None:
            metrics |= {"published_digest": float(published), "digest_match": float(loaded == published)}
            DIGEST_MATCH.set(metrics["digest_match"])
        self.report(gateway_pb2.EVENT_KIND_WEIGHTS, message=f"serving version {version}", metrics=metrics)
        if published is not None and loaded != published:
            self._digest_mismatch(version, loaded, published)

    def _digest_mismatch(self, version: int, loaded: int, published: int) -> None:
        """A warning event, or with `monitor.consistency.action: stop` the explorer's failure (the run's)."""
        line = (
            f"weights version {version}: digest_match 0, the weights loaded (digest {loaded:#x}) are not the ones "
            f"published (digest {published:#x})"
        )
        if self.config.monitor.consistency.action == "stop":
            raise WeightsDigestMismatch(f"{line} (monitor.consistency.action: stop)")
        log.warning("weights.digest_mismatch", run_id=self.run_id, version=version, loaded=loaded, published=published)
        self.report(gateway_pb2.EVENT_KIND_WARNING, message=line)

    def wait_for_weights(self, step: int) -> bool:
        """Swap in staged weights; block until the version explore step `step` needs has arrived.

        False when the run stopped first. Without a weight feed (mode `explore`) any version serves.
        """
        sync = self.config.synchronizer
        needed = required_version(step, sync.sync_interval, sync.sync_offset) if self.feed is not None else 0
        waiting: int | None = None  # since when the step has waited (a weight-wait span once the version is in)
        while True:
            applying = now_ms()
            self.apply_staged_weights()
            # A torn engine (an update that failed part-way) serves nothing until a whole version is in.
            if self.model_version >= needed and self.engine.torn is None:
                if waiting is not None:
                    self.record(gateway_pb2.PHASE_WEIGHT_WAIT, waiting, end_ms=applying, version=needed)
                return True
            if self.stopped:
                return False
            if self.feed is not None and self.feed.failure is not None:
                raise self.feed.failure
            waiting = now_ms() if waiting is None else waiting
            self.wait(STAGED_POLL_S)

    def wait_for_final_weights(self, train_steps: int) -> None:
        """Evaluate what training produced: wait (bounded) for the version published after `train_steps`."""
        if self.feed is None:
            return
        sync = self.config.synchronizer
        final = (train_steps // sync.sync_interval) * sync.sync_interval
        deadline = time.monotonic() + sync.timeout_seconds
        while self.model_version < final and time.monotonic() < deadline:
            if self.feed.failure is not None:
                return
            try:
                if self.gateway.get_run(self.run_id).state in RUN_OVER:
                    return
            except Exception:  # noqa: BLE001 - a gateway hiccup only shortens the wait
                return
            self.apply_staged_weights(wait_s=1.0)

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        if "judge" in self.__dict__ and self.judge is not None:  # only a judge that was built
            self.judge.judge.close()
        self.engine.close()
