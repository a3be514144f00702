"""One explorer's part of a run: lease tasks, roll out, put experiences, load new weights between batches.

Version discipline: explore step k needs weights of version >= required_version(k) (synchronous when
sync_offset is 0, one step ahead when 1, ...). New weights are staged by the weight feed and swapped in
only between rollout batches, so a batch never mixes versions.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from trinity.clients import BufferClient, GatewayClient
from trinity.clients.gateway import RunReporter
from trinity.config import RunConfig, naming
from trinity.explorer.engines import create_engine
from trinity.explorer.engines.base import Engine, SamplingSettings
from trinity.explorer.weight_feed import WeightFeed
from trinity.explorer.workflows import create_workflow
from trinity.explorer.workflows.base import RolloutSettings, Workflow
from trinity.models import resolve_model_path
from trinity.models.digest import weights_digest
from trinity.runtime.logging import get_logger
from trinity.runtime.run_host import ReportingRunner
from trinity.v1 import buffer_pb2, common_pb2, gateway_pb2

log = get_logger(__name__)

RUN_OVER = (gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED)
PASS_THRESHOLD = 1.0  # a sample "passes" when its reward reaches this (accuracy rewards are 0/1)


def required_version(step: int, sync_interval: int, sync_offset: int) -> int:
    """The oldest weight version explore step `step` may use."""
    return max(0, ((step - sync_offset) // sync_interval) * sync_interval)


def explore_steps(config: RunConfig) -> int:
    """Explore steps that feed `total_steps` train steps (or `total_steps` of pure exploring)."""
    if config.mode != "both":
        return config.buffer.total_steps
    per_step = config.buffer.batch_size * config.algorithm.repeat_times
    return -(-config.buffer.total_steps * config.train_batch_size // per_step)


def build_engine(config: RunConfig, model_path: str) -> Engine:
    options = {
        "model_path": model_path,
        "dtype": config.model.dtype,
        "seed": config.seed,
        **config.explorer.engine_options,
    }
    if config.explorer.engine == "vllm":
        options.setdefault("max_model_len", config.model.max_prompt_tokens + config.model.max_response_tokens)
    return create_engine(config.explorer.engine, **options)


@dataclass
class EvalSummary:
    accuracy: float
    mean_reward: float
    pass_at_k: float
    response_tokens: float
    samples: int
    per_taskset: dict[str, float] = field(default_factory=dict)


class ExplorerRunner(ReportingRunner):
    def __init__(
        self,
        *,
        run_id: str,
        stage: int,
        config: RunConfig,
        instance_id: str,
        buffer_address: str,
        gateway_address: str,
        engine_factory: Callable[[RunConfig, str], Engine] = build_engine,
        on_engine_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.on_engine_failure = on_engine_failure
        self.run_id = run_id
        self.stage = stage
        self.config = config
        self.instance_id = instance_id
        self.buffer = BufferClient(buffer_address, timeout=120)
        self.gateway = GatewayClient(gateway_address, timeout=30)
        self.reporter = RunReporter(self.gateway, run_id, f"explorer/{instance_id}", stage)
        self.engine_factory = engine_factory
        self.engine: Engine | None = None
        self.feed: WeightFeed | None = None
        self.step = 0
        self._stop = threading.Event()
        self.state = "starting"
        self.openai_url = ""  # serve mode: the bound OpenAI endpoint (serve.py)
        self.finish_message = "explorer finished"
        self._thread = threading.Thread(target=self._main, name=f"explorer-{run_id}", daemon=True)

    # ---- control ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: str = "") -> None:
        log.info("explorer.stopping", run_id=self.run_id, reason=reason)
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def model_version(self) -> int:
        return self.engine.model_version if self.engine is not None else 0

    # ---- the loop ---------------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._run()
            self._report("finished", message=self.finish_message)
            self.state = "finished"
        except Exception as err:
            log.exception("explorer.failed", run_id=self.run_id)
            self.state = "failed"
            self._report("error", message=f"{type(err).__name__}: {err}")
        finally:
            if self.feed is not None:
                self.feed.close()
            if self.engine is not None:
                self.engine.close()
            self.buffer.close()

    def _run(self) -> None:
        cfg = self.config
        model_path = resolve_model_path(cfg.model.path)
        with self._engine_guard():
            self.engine = self.engine_factory(cfg, model_path)
        self.state = "running"
        workflow = create_workflow(cfg.explorer.workflow, **cfg.explorer.workflow_options)
        settings = self._rollout_settings(cfg.explorer.temperature, cfg.algorithm.repeat_times)
        if cfg.mode == "bench":  # bench.py: evaluate, write the JSON report, name it in the finished event
            from trinity.explorer.bench import run_bench

            self.finish_message = f"bench report: {run_bench(self, workflow)}"
            return
        if cfg.mode == "serve":  # serve.py: the OpenAI endpoint records agent calls until the run stops
            from trinity.explorer.serve import serve_until_stopped

            serve_until_stopped(self)
            return
        if cfg.mode == "both":
            # A replacement explorer continues the run's step count (and so its version requirement).
            self.step = int(self.gateway.get_run(self.run_id).explore_step)
            self.feed = WeightFeed(self.gateway, self.run_id, self.instance_id)
            self.feed.start()
        if cfg.explorer.eval_on_start and cfg.buffer.eval_tasksets:
            self._evaluate(workflow)
        last_eval_version = 0
        taskset = naming.taskset(self.run_id, self.stage, cfg.buffer.taskset.name)  # type: ignore[union-attr]
        stream = naming.experience_stream(self.run_id, self.stage, cfg.buffer.experience_stream.name)
        limit = explore_steps(cfg)
        while not self._stop.is_set() and self.step < limit:
            if not self._wait_for_weights(self.step):
                break
            started = time.perf_counter()
            leased = self.buffer.lease_tasks(taskset, self.instance_id, cfg.buffer.batch_size)
            if not leased.tasks:
                if leased.exhausted:
                    break
                self._stop.wait(0.5)  # tasks are leased elsewhere; they may come back
                continue
            with self._engine_guard():
                batches = workflow.run_batch(list(leased.tasks), self.engine, settings)
            experiences = [e for batch in batches for e in batch]
            put = self.buffer.put(stream, experiences)
            self.buffer.complete_tasks(taskset, self.instance_id, _results(leased.tasks, batches))
            self._report_step(experiences, put, time.perf_counter() - started)
            self.step += 1
            version = self.engine.model_version
            interval = cfg.explorer.eval_interval
            if interval and cfg.buffer.eval_tasksets and version - last_eval_version >= interval:
                self._apply_staged_weights()
                self._evaluate(workflow)
                last_eval_version = self.engine.model_version
        if self.feed is not None:
            self._wait_for_final_weights()
        if cfg.buffer.eval_tasksets and self.engine.model_version != last_eval_version:
            self._evaluate(workflow)

    @contextlib.contextmanager
    def _engine_guard(self) -> Iterator[None]:
        """An engine that fails to load or generate takes the service out of rotation (health
        NOT_SERVING) instead of leaving it up and useless."""
        try:
            yield
        except Exception as err:
            if self.on_engine_failure is not None:
                self.on_engine_failure(f"{type(err).__name__}: {err}")
            raise

    def _rollout_settings(self, temperature: float, repeat_times: int) -> RolloutSettings:
        cfg = self.config
        sampling = SamplingSettings(
            temperature=temperature,
            top_p=cfg.explorer.top_p,
            top_k=cfg.explorer.top_k,
            max_tokens=cfg.model.max_response_tokens,
            stop=tuple(cfg.explorer.stop),
        )
        return RolloutSettings(
            repeat_times=repeat_times,
            sampling=sampling,
            reward_timeout_s=cfg.explorer.reward_timeout_seconds,
            run_id=self.run_id,
        )

    # ---- weights -------------------------------------------------------------------------------------

    def _wait_for_weights(self, step: int) -> bool:
        """Swap in staged weights; block until the version this step needs has arrived."""
        sync = self.config.synchronizer
        needed = required_version(step, sync.sync_interval, sync.sync_offset) if self.feed is not None else 0
        while True:
            self._apply_staged_weights()
            if self.model_version >= needed:
                return True
            if self._stop.is_set():
                return False
            if self.feed is not None and self.feed.error is not None:
                raise RuntimeError(f"weight sync failed: {self.feed.error}")
            self._stop.wait(0.05)

    def _wait_for_final_weights(self) -> None:
        """Evaluate what training produced: wait (bounded) for the trainer's last published version."""
        sync = self.config.synchronizer
        final = (self.config.buffer.total_steps // sync.sync_interval) * sync.sync_interval
        deadline = time.monotonic() + sync.timeout_seconds
        while self.model_version < final and time.monotonic() < deadline:
            if self.feed is not None and self.feed.error is not None:
                return
            try:
                if self.gateway.get_run(self.run_id).state in RUN_OVER:
                    return
            except Exception:  # noqa: BLE001 - a gateway hiccup only shortens the wait
                return
            self._apply_staged_weights(wait_s=1.0)

    def _apply_staged_weights(self, wait_s: float = 0.0) -> None:
        if self.feed is None or self.engine is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            staged = self.feed.take()
            if staged is not None:
                version, tensors = staged
                started = time.perf_counter()
                self.engine.load_weights(version, tensors)
                self._report(
                    "weights",
                    message=f"serving version {version}",
                    metrics={
                        "load_seconds": time.perf_counter() - started,
                        "weights_digest": float(weights_digest(tensors)),
                        "version": float(version),
                    },
                )
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    # ---- evaluation --------------------------------------------------------------------------------------

    def _evaluate(self, workflow: Workflow) -> EvalSummary | None:
        cfg = self.config
        started = time.perf_counter()
        settings = self._rollout_settings(cfg.explorer.eval_temperature, cfg.explorer.eval_repeat_times)
        rewards: list[float] = []
        group_pass: list[bool] = []
        lengths: list[float] = []
        per_taskset: dict[str, float] = {}
        for section in cfg.buffer.eval_tasksets:
            name = naming.taskset(self.run_id, self.stage, section.name)
            size = self.buffer.taskset(name).size
            leased = self.buffer.lease_tasks(name, self.instance_id, int(size))
            if not leased.tasks:
                continue
            batches = workflow.run_batch(list(leased.tasks), self.engine, settings)
            self.buffer.complete_tasks(name, self.instance_id, _results(leased.tasks, batches))
            scores = [e.reward for b in batches for e in b if not e.failed]
            per_taskset[section.name] = _mean([s >= PASS_THRESHOLD for s in scores])
            rewards += scores
            group_pass += [any(e.reward >= PASS_THRESHOLD for e in b) for b in batches]
            lengths += [len(e.response_token_ids) for b in batches for e in b]
        if not rewards:
            return None
        summary = EvalSummary(
            accuracy=_mean([r >= PASS_THRESHOLD for r in rewards]),
            mean_reward=_mean(rewards),
            pass_at_k=_mean(group_pass),
            response_tokens=_mean(lengths),
            samples=len(rewards),
            per_taskset=per_taskset,
        )
        metrics = {
            "accuracy": summary.accuracy,
            "mean_reward": summary.mean_reward,
            f"pass@{cfg.explorer.eval_repeat_times}": summary.pass_at_k,
            "response_tokens": summary.response_tokens,
            "samples": float(summary.samples),
            "seconds": time.perf_counter() - started,
            **{f"accuracy/{k}": v for k, v in per_taskset.items()},
        }
        self._report("eval", metrics=metrics, message=f"eval at version {self.model_version}")
        return summary

    # ---- reporting ----------------------------------------------------------------------------------------

    def _report_step(
        self, experiences: list[common_pb2.Experience], put: buffer_pb2.PutExperiencesResponse, seconds: float
    ) -> None:
        ok = [e for e in experiences if not e.failed]
        tokens = sum(len(e.response_token_ids) for e in experiences)
        metrics = {
            "reward_mean": _mean([e.reward for e in ok]),
            "reward_std": statistics.pstdev([e.reward for e in ok]) if len(ok) > 1 else 0.0,
            "pass_rate": _mean([e.reward >= PASS_THRESHOLD for e in ok]),
            "response_tokens": _mean([len(e.response_token_ids) for e in experiences]),
            "failed": float(len(experiences) - len(ok)),
            "accepted": float(put.accepted),
            "dropped": float(sum(put.dropped.values())),
            "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
            "seconds": seconds,
        }
        self._report("explore", step=self.step + 1, metrics=metrics)


def _mean(values: list[float] | list[bool] | list[int]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _results(
    tasks: list[common_pb2.Task] | object, batches: list[list[common_pb2.Experience]]
) -> list[buffer_pb2.TaskResult]:
    results = []
    for task, batch in zip(tasks, batches, strict=True):  # type: ignore[call-overload]
        scored = [e for e in batch if not e.failed]
        rate = _mean([e.reward >= PASS_THRESHOLD for e in scored]) if scored else -1.0
        results.append(
            buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id, pass_rate=rate, samples=len(scored))
        )
    return results
