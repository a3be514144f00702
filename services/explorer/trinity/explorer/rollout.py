"""Modes `both` and `explore`: lease tasks, roll out, put experiences, load new weights between batches.

Explore step k needs weights of version >= required_version(k) (synchronous when sync_offset is 0,
one step ahead when 1, ...); in mode `explore` there is no trainer and any version serves. The held-out
task sets are evaluated at the start, every `explorer.eval_interval` versions, and at the end.
"""

from __future__ import annotations

import statistics
import time

from trinity.config import RunConfig
from trinity.explorer.context import ExplorerContext
from trinity.explorer.evaluation import evaluate, passed, task_results
from trinity.explorer.metrics import ENGINE_QUEUE, record_rollout
from trinity.v1 import buffer_pb2, common_pb2


def explore_steps(config: RunConfig) -> int:
    """Explore steps that feed `total_steps` train steps (or `total_steps` of pure exploring)."""
    if config.mode != "both":
        return config.buffer.total_steps
    per_step = config.buffer.batch_size * config.algorithm.repeat_times
    return -(-config.buffer.total_steps * config.train_batch_size // per_step)


def run(ctx: ExplorerContext) -> str:
    """Explore until the step limit, the task set runs out, or the run stops; returns the finish message."""
    cfg = ctx.config
    taskset_section = cfg.buffer.taskset
    if taskset_section is None:  # RunConfig refuses modes both/explore without one
        raise ValueError("buffer.taskset: required to explore")
    settings = ctx.rollout_settings(cfg.explorer.temperature, cfg.algorithm.repeat_times)
    if cfg.mode == "both":
        # A replacement explorer continues the run's step count (and so its version requirement).
        ctx.step = int(ctx.gateway.get_run(ctx.run_id).explore_step)
        ctx.start_weight_feed()
    if cfg.explorer.eval_on_start and cfg.buffer.eval_tasksets and ctx.step == 0:  # not again by a replacement
        _evaluate(ctx)
    last_eval_version = 0
    taskset = ctx.taskset(taskset_section.name)
    stream = ctx.experience_stream()
    limit = explore_steps(cfg)
    while not ctx.stopped and ctx.step < limit:
        if not ctx.wait_for_weights(ctx.step):
            break
        started = time.perf_counter()
        leased = ctx.buffer.lease_tasks(taskset, ctx.instance_id, cfg.buffer.batch_size)
        if not leased.tasks:
            if leased.exhausted:
                break
            ctx.wait(0.5)  # tasks are leased elsewhere; they may come back
            continue
        ENGINE_QUEUE.set(len(leased.tasks) * settings.repeat_times)
        with ctx.engine_guard():
            batches = ctx.workflow.run_batch(list(leased.tasks), ctx.engine, settings)
        ENGINE_QUEUE.set(0)
        experiences = [e for batch in batches for e in batch]
        put = ctx.buffer.put(stream, experiences)
        ctx.buffer.complete_tasks(taskset, ctx.instance_id, task_results(leased.tasks, batches))
        _report_step(ctx, experiences, put, time.perf_counter() - started)
        ctx.step += 1
        interval = cfg.explorer.eval_interval
        if interval and cfg.buffer.eval_tasksets and ctx.model_version - last_eval_version >= interval:
            ctx.apply_staged_weights()
            _evaluate(ctx)
            last_eval_version = ctx.model_version
    if ctx.abandoned:
        return "explorer stopped"
    ctx.wait_for_final_weights()
    if cfg.buffer.eval_tasksets and ctx.model_version != last_eval_version:
        _evaluate(ctx)
    return "explorer finished"


def _evaluate(ctx: ExplorerContext) -> None:
    evaluation = evaluate(ctx, ctx.config.buffer.eval_tasksets)
    if evaluation.overall["samples"]:
        ctx.report("eval", metrics=evaluation.metrics(), message=f"eval at version {ctx.model_version}")


def _report_step(
    ctx: ExplorerContext,
    experiences: list[common_pb2.Experience],
    put: buffer_pb2.PutExperiencesResponse,
    seconds: float,
) -> None:
    ok = [e for e in experiences if not e.failed]
    tokens = sum(len(e.response_token_ids) for e in experiences)
    metrics = {
        "reward_mean": _mean([e.reward for e in ok]),
        "reward_std": statistics.pstdev([e.reward for e in ok]) if len(ok) > 1 else 0.0,
        "pass_rate": _mean([passed(e) for e in ok]),
        "response_tokens": _mean([len(e.response_token_ids) for e in experiences]),
        "failed": float(len(experiences) - len(ok)),
        "accepted": float(put.accepted),
        "dropped": float(sum(put.dropped.values())),
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
    }
    record_rollout(metrics, len(experiences), ctx.step, ctx.model_version)
    ctx.report("explore", step=ctx.step + 1, metrics=metrics)


def _mean(values: list[float] | list[bool] | list[int]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
