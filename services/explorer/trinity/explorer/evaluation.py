"""Scoring rollouts: what "passed" means, the pass rates fed to the curriculum, and the one evaluator.

Both the periodic evaluation of rollout modes and bench mode evaluate here: every task of each task
set is run once, `explorer.eval_repeat_times` times at `explorer.eval_temperature`, in lease chunks
of `LEASE_CHUNK` tasks. Metrics per task set and overall: accuracy (share of samples that passed;
failed samples count as wrong), mean reward, unbiased pass@k for k = 1, 2, 4, ... and k = repeats
(Chen et al. 2021: 1 - C(n-c, k) / C(n, k) per task, averaged), mean response length.

Pass rates have one writer: the explorer, completing its leases (`task_results`); the Buffer's task
set records them for the difficulty curriculum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from trinity.config.buffer import TaskSetConfig
from trinity.explorer.context import ExplorerContext
from trinity.v1 import buffer_pb2, common_pb2, gateway_pb2

PASS_THRESHOLD = 1.0  # a sample passes when its reward reaches this (accuracy rewards are 0/1)
LEASE_CHUNK = 64

Group = Sequence[common_pb2.Experience]  # every sample of one task


def passed(experience: common_pb2.Experience) -> bool:
    """An episode of a multi-step workflow passes when it was won (its `success` metric): its return may be shaped
    (an invalid move's penalty) below the threshold while it still won."""
    if experience.failed:
        return False
    if "success" in experience.metrics:
        return experience.metrics["success"] >= 1.0
    return experience.reward >= PASS_THRESHOLD


def episodes(samples: Sequence[common_pb2.Experience]) -> list[common_pb2.Experience]:
    """One sample per episode: a multi-step episode is one experience per step, all with its `episode_id` (and its
    return and success), and counting each step would weigh a long lost episode above a short won one."""
    seen: set[str] = set()
    out = []
    for e in samples:
        if e.episode_id:
            if e.episode_id in seen:
                continue
            seen.add(e.episode_id)
        out.append(e)
    return out


def task_results(tasks: Sequence[common_pb2.Task], groups: Sequence[Group]) -> list[buffer_pb2.TaskResult]:
    """CompleteTasks results: each task's pass rate over its scored samples (-1 when none scored)."""
    results = []
    for task, group in zip(tasks, groups, strict=True):
        scored = [e for e in episodes(group) if not e.failed]
        rate = sum(passed(e) for e in scored) / len(scored) if scored else -1.0
        results.append(
            buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id, pass_rate=rate, samples=len(scored))
        )
    return results


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with `c` passing samples out of `n` (needs k <= n)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
    return ks if ks[-1] == n else [*ks, n]


def summarize(groups: Sequence[Group]) -> dict[str, float]:
    """Metrics over task groups, a multi-step episode one sample. Failed samples count as wrong (reward 0)."""
    groups = [episodes(g) for g in groups]
    samples = [e for g in groups for e in g]
    if not samples:
        return {"tasks": 0.0, "samples": 0.0}
    rewards = [0.0 if e.failed else e.reward for e in samples]
    out = {
        "tasks": float(len(groups)),
        "samples": float(len(samples)),
        "failed": float(sum(e.failed for e in samples)),
        "accuracy": sum(passed(e) for e in samples) / len(samples),
        "mean_reward": sum(rewards) / len(rewards),
        "response_tokens": sum(len(e.response_token_ids) for e in samples) / len(samples),
    }
    n = min(len(g) for g in groups)  # every group has repeat_times samples; min keeps k valid regardless
    for k in k_values(n) if n > 0 else []:
        per_task = [pass_at_k(len(g), sum(passed(e) for e in g), k) for g in groups]
        out[f"pass@{k}"] = sum(per_task) / len(per_task)
    return out


@dataclass
class Evaluation:
    overall: dict[str, float]
    tasksets: dict[str, dict[str, float]]  # by the task set's config name
    seconds: float

    def metrics(self) -> dict[str, float]:
        """The `eval` event's metrics: overall, `<metric>/<taskset>`, and the evaluation's own duration."""
        per_set = {f"{k}/{name}": v for name, m in self.tasksets.items() for k, v in m.items()}
        return {**self.overall, **per_set, "seconds": self.seconds}


def evaluate(ctx: ExplorerContext, sections: Sequence[TaskSetConfig]) -> Evaluation:
    """Run every task of each task set once with the eval sampling settings; completes their leases."""
    started = time.perf_counter()
    explorer = ctx.config.explorer
    settings = ctx.rollout_settings(explorer.eval_temperature, explorer.eval_repeat_times, evaluation=True)
    tasksets: dict[str, dict[str, float]] = {}
    everything: list[Group] = []
    sizes = {section.name: int(ctx.buffer.taskset(ctx.taskset(section.name)).size) for section in sections}
    samples = sum(sizes.values()) * explorer.eval_repeat_times
    with ctx.phase(gateway_pb2.PHASE_EVALUATE, detail=f"{samples} samples"):
        for section in sections:
            name, size = ctx.taskset(section.name), sizes[section.name]
            groups: list[Group] = []
            while len(groups) < size:  # eval sets cycle endlessly: stop after one pass
                leased = ctx.buffer.lease_tasks(name, ctx.instance_id, min(LEASE_CHUNK, size - len(groups)))
                if not leased.tasks:
                    break
                batches = ctx.task_workflows.run_batch(list(leased.tasks), ctx.engine, settings)
                ctx.buffer.complete_tasks(name, ctx.instance_id, task_results(leased.tasks, batches))
                groups += batches
            tasksets[section.name] = summarize(groups)
            everything += groups
    return Evaluation(overall=summarize(everything), tasksets=tasksets, seconds=time.perf_counter() - started)
