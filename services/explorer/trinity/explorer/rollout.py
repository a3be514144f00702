"""Modes `both` and `explore`: lease tasks, roll out, put experiences, load new weights between batches.

Explore step k needs weights of version >= required_version(k) (synchronous when sync_offset is 0,
one step ahead when 1, ...); in mode `explore` there is no trainer and any version serves. The held-out
task sets are evaluated at the start (the starting weights, once the first batch is put), every
`explorer.eval_interval` versions, and at the end.

In mode `both` the explorer counts train batches, not explore steps: when the stream's operators drop
experiences (DAPO's dynamic sampling drops groups without reward signal) it explores on until the stream
holds `total_steps` train batches, or `explorer.max_explore_factor` times the steps that would have fed
them undropped. The weight version a step needs follows the batches fed, so a trainer waiting for data
never waits on an explorer waiting for weights.

A step's rollouts run in a `RolloutPool` (concurrent, time-limited, retried; a rollout that keeps failing is
dropped and counted) while a `LeaseKeeper` renews the step's task leases. A dropped task is completed as
failed: it is not handed out again and records no pass rate.

With several train task sets (`buffer.tasksets`) the explorer leases from their mixture in the Buffer, which
draws each task's set; a task belongs to its own set (`Task.taskset`), where its lease is renewed and completed.
Explore events carry the step's metrics per train task set too (`reward_mean/<name>`, `pass_rate/<name>`,
`tasks/<name>`).

A step's phases (the wait for its weights and their load, lease, rollout, reward, put) are timed as spans that ride
on its explore event, for the run's timeline (docs/console.md, "Timeline").
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import TypeVar

from trinity.config import RunConfig
from trinity.config.modes import RunMode
from trinity.explorer.context import ExplorerContext
from trinity.explorer.evaluation import episodes, evaluate, passed, task_results
from trinity.explorer.leases import LeaseKeeper
from trinity.explorer.metrics import ENGINE_QUEUE, record_rollout
from trinity.explorer.rollout_pool import Rollout, RolloutLimits, RolloutPool
from trinity.explorer.workflows.base import RolloutSettings, Workflow
from trinity.runtime.spans import Envelope, now_ms
from trinity.v1 import buffer_pb2, common_pb2, gateway_pb2

_DROPS_LISTED = 8  # tasks named in a step's "dropped" log event
T = TypeVar("T")


def needs_greedy_baseline(config: RunConfig, workflow: Workflow) -> bool:
    """Whether rollouts add ReMax's greedy sample; a workflow that cannot add one is refused up front."""
    algorithm = config.algorithm.algorithm_type
    if not config.algorithm.preset.greedy_baseline:
        return False
    if not workflow.supports_greedy_baseline:
        raise ValueError(
            f"algorithm.algorithm_type: {algorithm!r} needs a greedy baseline sample per task, which workflow "
            f"{config.explorer.workflow!r} cannot produce (use a single-turn workflow: math, countdown)"
        )
    return True


def explore_steps(config: RunConfig) -> int:
    """Explore steps that feed `total_steps` train steps (or `total_steps` of pure exploring)."""
    if config.mode != RunMode.BOTH:
        return config.buffer.total_steps
    per_step = config.buffer.batch_size * config.algorithm.group_size
    return -(-config.buffer.total_steps * config.train_batch_size // per_step)


@dataclass(frozen=True)
class ExploreBudget:
    """When exploring stops and which step's weights a step needs, from the train batches fed so far.

    `train_steps` is 0 without a trainer (mode `explore`): then explore steps alone count.
    """

    train_steps: int
    step_cap: int

    @classmethod
    def of(cls, config: RunConfig) -> ExploreBudget:
        steps = explore_steps(config)
        if config.mode != RunMode.BOTH:
            return cls(train_steps=0, step_cap=steps)
        return cls(config.buffer.total_steps, math.ceil(steps * config.explorer.max_explore_factor))

    def more(self, step: int, fed: int) -> bool:
        """Whether explore step `step` runs, with `fed` train batches in the stream."""
        return step < self.step_cap and not (self.train_steps and fed >= self.train_steps)

    def version_step(self, step: int, fed: int) -> int:
        """The step whose weights explore step `step` needs: never past the batches the trainer could train."""
        return min(step, fed) if self.train_steps else step

    def capped(self, step: int, fed: int) -> bool:
        """The cap, not the batches, ended exploring: the trainer gets fewer than `train_steps` batches."""
        return bool(self.train_steps) and fed < self.train_steps and step >= self.step_cap


def run(ctx: ExplorerContext) -> str:
    """Explore until the step limit, the task set runs out, or the run stops; returns the finish message."""
    cfg = ctx.config
    train = {ctx.taskset(section.name): section for section in cfg.buffer.train_tasksets}  # by Buffer name
    if not train:  # RunConfig refuses modes both/explore without one
        raise ValueError("buffer.taskset: required to explore")
    greedy_baseline = needs_greedy_baseline(cfg, ctx.workflow)
    if cfg.mode == RunMode.BOTH:
        # A replacement explorer continues the run's step count (and so its version requirement).
        ctx.step = int(ctx.gateway.get_run(ctx.run_id).explore_step)
        ctx.start_weight_feed()
    # The starting weights are evaluated once the first batch is in the stream, not before it: the trainer's first
    # step then runs beside the evaluation instead of after it. Not again by a replacement.
    evaluate_start = cfg.explorer.eval_on_start and bool(cfg.buffer.eval_tasksets) and ctx.step == 0
    last_eval_version = 0
    source = ctx.train_tasks()  # the one train task set, or the mixture of several
    names = {name: section.name for name, section in train.items()}
    stream = ctx.experience_stream()
    budget = ExploreBudget.of(cfg)
    fed = _batches_fed(ctx, stream, budget)
    pool = RolloutPool(ctx.task_workflows, ctx.engine, RolloutLimits.of(cfg.explorer))
    proven = ctx.step > 0  # a replacement explorer joins a run whose rollouts have worked
    while not ctx.stopped and budget.more(ctx.step, fed):
        if not ctx.hold_while_paused():  # paused by Steer: no lease, no rollout until resumed (or stopped)
            break
        if not ctx.wait_for_weights(budget.version_step(ctx.step, fed)):
            break
        # Per step: a live run's temperature may be steered between steps.
        settings = replace(
            ctx.rollout_settings(cfg.explorer.temperature, cfg.algorithm.group_size),
            greedy_baseline=greedy_baseline,
            reward_clock=Envelope(),
        )
        started, leasing = time.perf_counter(), now_ms()
        leased = ctx.buffer.lease_tasks(source, ctx.instance_id, cfg.buffer.batch_size)
        if not leased.tasks:
            if leased.exhausted:
                break
            ctx.wait(0.5)  # tasks are leased elsewhere; they may come back
            continue
        ctx.record(gateway_pb2.PHASE_LEASE, leasing)
        tasks = list(leased.tasks)
        ENGINE_QUEUE.set(len(tasks) * settings.repeat_times)
        with ExitStack() as held:
            keepers = [
                held.enter_context(LeaseKeeper(ctx.buffer, name, ctx.instance_id, group, train[name].lease_seconds))
                for name, group in by_taskset(tasks, tasks).items()
            ]
            held.enter_context(ctx.engine_guard())
            with ctx.timed(gateway_pb2.PHASE_ROLLOUT, detail=f"{len(tasks) * settings.repeat_times} samples"):
                rollouts = pool.run(tasks, settings)
        ENGINE_QUEUE.set(0)
        _record_rewards(ctx, settings)
        proven = fail_fast(rollouts, proven)
        experiences = [e for r in rollouts for e in r.experiences]
        with ctx.timed(gateway_pb2.PHASE_PUT, detail=f"{len(experiences)} experiences"):
            put = ctx.buffer.put(stream, experiences) if experiences else buffer_pb2.PutExperiencesResponse()
            for name, results in by_taskset([r.task for r in rollouts], rollout_results(rollouts)).items():
                ctx.buffer.complete_tasks(name, ctx.instance_id, results)
            fed = _batches_fed(ctx, stream, budget)
        lost = [task_id for keeper in keepers for task_id in keeper.lost]
        _report_step(ctx, rollouts, put, time.perf_counter() - started, fed, lost, names)
        ctx.step += 1
        if evaluate_start:  # still the starting weights: new ones are applied only as a step begins
            evaluate_start = False
            _evaluate(ctx)
        interval = cfg.explorer.eval_interval
        if interval and cfg.buffer.eval_tasksets and ctx.model_version - last_eval_version >= interval:
            ctx.apply_staged_weights()
            _evaluate(ctx)
            last_eval_version = ctx.model_version
    if ctx.abandoned:
        return "explorer stopped"
    if evaluate_start:  # no step was explored (the task set was empty or taken by others)
        _evaluate(ctx)
    if budget.capped(ctx.step, fed):
        ctx.report(
            gateway_pb2.EVENT_KIND_LOG,
            message=f"explore cap reached: {ctx.step} explore steps filled {fed} of {cfg.buffer.total_steps} "
            "train batches (raise explorer.max_explore_factor to sample more)",
        )
    ctx.wait_for_final_weights(min(fed, cfg.buffer.total_steps))  # no feed (mode explore): returns at once
    if cfg.buffer.eval_tasksets and ctx.model_version != last_eval_version:
        _evaluate(ctx)
    return "explorer finished"


def fail_fast(rollouts: list[Rollout], proven: bool) -> bool:
    """Whether the run's rollouts have been seen to work, after this step; raises when they never have.

    A dropped rollout is the task's or the moment's bad luck once some rollout of the run has worked. Before
    that, a step in which every rollout failed, at least one with an error (not a timeout), says the setup is
    broken (a workflow refusing the task shape, a reward name that does not resolve): the run fails with it
    rather than dropping the whole task set one step at a time. Timeouts alone never fail it: a slow first
    step (compilation, a cold cache) is not a broken config.
    """
    if proven or any(not r.dropped for r in rollouts):
        return True
    errors = [r for r in rollouts if r.error is not None and r.drop_reason != "timeout"]
    if errors:
        first = errors[0]
        raise RuntimeError(
            f"no rollout has succeeded yet and every rollout of this step failed; task {first.task.id!r} after "
            f"{first.attempts} attempts: {type(first.error).__name__}: {first.error}"
        ) from first.error
    return False


def rollout_results(rollouts: list[Rollout]) -> list[buffer_pb2.TaskResult]:
    """CompleteTasks results: pass rates of the rolled-out tasks; dropped ones completed as failed."""
    results = task_results([r.task for r in rollouts], [r.experiences for r in rollouts])
    for result, rollout in zip(results, rollouts, strict=True):
        result.failed = rollout.dropped
    return results


def by_taskset(tasks: Sequence[common_pb2.Task], items: Sequence[T]) -> dict[str, list[T]]:
    """`items` (one per task, in order) by their task's own task set (`Task.taskset`): where its lease is renewed
    and completed, also when the task came from a mixture."""
    groups: dict[str, list[T]] = defaultdict(list)
    for task, item in zip(tasks, items, strict=True):
        groups[task.taskset].append(item)
    return dict(groups)


def taskset_metrics(rollouts: Sequence[Rollout], names: Mapping[str, str]) -> dict[str, float]:
    """The step's metrics per train task set, under its config name (`names`: Buffer name -> config name):
    `reward_mean/<name>` and `pass_rate/<name>` over its scored samples, like the step's own, and `tasks/<name>`,
    how many of the step's tasks it gave."""
    metrics: dict[str, float] = {}
    for taskset, group in sorted(by_taskset([r.task for r in rollouts], rollouts).items()):
        name = names.get(taskset, taskset)
        ok = [e for r in group for e in r.experiences if not e.failed]
        metrics[f"reward_mean/{name}"] = _mean([e.reward for e in ok])
        metrics[f"pass_rate/{name}"] = _mean([passed(e) for e in episodes(ok)])
        metrics[f"tasks/{name}"] = float(len(group))
    return metrics


def _batches_fed(ctx: ExplorerContext, stream: str, budget: ExploreBudget) -> int:
    """Train batches the stream has accepted so far, from every explorer of the run (after operators)."""
    if not budget.train_steps:
        return 0
    return int(ctx.buffer.stream(stream).stats.put) // ctx.config.train_batch_size


def _record_rewards(ctx: ExplorerContext, settings: RolloutSettings) -> None:
    """The step's reward span: from its first reward call to its last (they interleave with sampling when the
    engine runs rollouts concurrently)."""
    clock = settings.reward_clock
    if clock is not None and clock.start_ms is not None:
        ctx.record(gateway_pb2.PHASE_REWARD, clock.start_ms, end_ms=clock.end_ms)


def _evaluate(ctx: ExplorerContext) -> None:
    evaluation = evaluate(ctx, ctx.config.buffer.eval_tasksets)
    if evaluation.overall["samples"]:
        ctx.report(
            gateway_pb2.EVENT_KIND_EVAL, metrics=evaluation.metrics(), message=f"eval at version {ctx.model_version}"
        )


def _report_step(
    ctx: ExplorerContext,
    rollouts: list[Rollout],
    put: buffer_pb2.PutExperiencesResponse,
    seconds: float,
    batches_fed: int,
    lost_leases: list[str],
    names: Mapping[str, str],
) -> None:
    experiences = [e for r in rollouts for e in r.experiences]
    ok = [e for e in experiences if not e.failed]
    tokens = sum(len(e.response_token_ids) for e in experiences)
    metrics = {
        "reward_mean": _mean([e.reward for e in ok]),
        "reward_std": statistics.pstdev([e.reward for e in ok]) if len(ok) > 1 else 0.0,
        "pass_rate": _mean([passed(e) for e in episodes(ok)]),
        "response_tokens": _mean([len(e.response_token_ids) for e in experiences]),
        "failed": float(len(experiences) - len(ok)),
        "judge_fallbacks": float(sum(e.reward_components.get("judge_fallback", 0.0) for e in experiences)),
        "accepted": float(put.accepted),
        "dropped": float(sum(put.dropped.values())),
        "train_batches_fed": float(batches_fed),
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
        **_failure_metrics(rollouts, lost_leases),
        **taskset_metrics(rollouts, names),
    }
    record_rollout(metrics, len(experiences), ctx.step, ctx.model_version)
    ctx.report(gateway_pb2.EVENT_KIND_EXPLORE, step=ctx.step + 1, metrics=metrics)
    dropped = [r for r in rollouts if r.dropped]
    if dropped:
        shown = ", ".join(f"{r.task.id} ({r.drop_reason})" for r in dropped[:_DROPS_LISTED])
        more = f" and {len(dropped) - _DROPS_LISTED} more" if len(dropped) > _DROPS_LISTED else ""
        ctx.report(
            gateway_pb2.EVENT_KIND_LOG, step=ctx.step + 1, message=f"dropped {len(dropped)} rollouts: {shown}{more}"
        )


def _failure_metrics(rollouts: list[Rollout], lost_leases: list[str]) -> dict[str, float]:
    """`dropped_rollouts` and one `dropped_rollouts.<reason>` per reason seen, retries, lost leases."""
    reasons = Counter(r.drop_reason for r in rollouts if r.dropped)
    return {
        "dropped_rollouts": float(reasons.total()),
        **{f"dropped_rollouts.{reason}": float(n) for reason, n in sorted(reasons.items())},
        "rollout_retries": float(sum(max(r.attempts - 1, 0) for r in rollouts)),
        "leases_lost": float(len(lost_leases)),
    }


def _mean(values: list[float] | list[bool] | list[int]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
