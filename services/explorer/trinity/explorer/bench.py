"""Bench mode: evaluate a model directory or checkpoint on task sets and write a JSON report.

Every task of each eval task set (or of `buffer.taskset` when there are none) is run
`explorer.eval_repeat_times` times at `explorer.eval_temperature`. Per task set and overall:
accuracy (share of samples with reward >= 1), mean reward, unbiased pass@k for k = 1, 2, 4, ... and
k = repeats (Chen et al. 2021: 1 - C(n-c, k) / C(n, k) per task, averaged), mean response length.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.config import RunConfig, naming
from trinity.explorer.workflows.base import Workflow
from trinity.v1 import buffer_pb2, common_pb2

if TYPE_CHECKING:
    from trinity.explorer.runner import ExplorerRunner

PASS_THRESHOLD = 1.0  # as in runner.py: accuracy rewards are 0/1
LEASE_CHUNK = 64


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


def summarize(groups: Sequence[Sequence[common_pb2.Experience]]) -> dict[str, float]:
    """Metrics over task groups (one group = every sample of one task). Failed samples count as wrong."""
    samples = [e for g in groups for e in g]
    if not samples:
        return {"tasks": 0.0, "samples": 0.0}
    rewards = [0.0 if e.failed else e.reward for e in samples]
    out = {
        "tasks": float(len(groups)),
        "samples": float(len(samples)),
        "failed": float(sum(e.failed for e in samples)),
        "accuracy": sum(r >= PASS_THRESHOLD for r in rewards) / len(rewards),
        "mean_reward": sum(rewards) / len(rewards),
        "response_tokens": sum(len(e.response_token_ids) for e in samples) / len(samples),
    }
    n = min(len(g) for g in groups)  # every group has repeat_times samples; min keeps k valid regardless
    for k in k_values(n) if n > 0 else []:
        per_task = [pass_at_k(len(g), sum(not e.failed and e.reward >= PASS_THRESHOLD for e in g), k) for g in groups]
        out[f"pass@{k}"] = sum(per_task) / len(per_task)
    return out


def report_path(config: RunConfig) -> Path:
    if config.explorer.bench_output:
        return Path(config.explorer.bench_output)
    return Path(config.checkpoint_dir or ".") / "bench_report.json"


def evaluate_taskset(runner: ExplorerRunner, workflow: Workflow, name: str) -> list[list[common_pb2.Experience]]:
    """Every task of the Buffer task set `name` (its full name), once, in chunks; one group per task."""
    cfg = runner.config
    settings = runner._rollout_settings(cfg.explorer.eval_temperature, cfg.explorer.eval_repeat_times)
    size = int(runner.buffer.taskset(name).size)
    groups: list[list[common_pb2.Experience]] = []
    while len(groups) < size:  # eval sets cycle endlessly: stop after one pass
        leased = runner.buffer.lease_tasks(name, runner.instance_id, min(LEASE_CHUNK, size - len(groups)))
        if not leased.tasks:
            break
        batches = workflow.run_batch(list(leased.tasks), runner.engine, settings)  # type: ignore[arg-type]
        results = [_task_result(task, batch) for task, batch in zip(leased.tasks, batches, strict=True)]
        runner.buffer.complete_tasks(name, runner.instance_id, results)
        groups += batches
    return groups


def run_bench(runner: ExplorerRunner, workflow: Workflow) -> Path:
    """Evaluate, report an "eval" event, write the JSON report; returns its path."""
    cfg = runner.config
    sections = cfg.buffer.eval_tasksets or ((cfg.buffer.taskset,) if cfg.buffer.taskset is not None else ())
    started = time.perf_counter()
    per_set: dict[str, dict[str, float]] = {}
    all_groups: list[list[common_pb2.Experience]] = []
    for section in sections:
        assert section is not None
        groups = evaluate_taskset(runner, workflow, naming.taskset(runner.run_id, runner.stage, section.name))
        per_set[section.name] = summarize(groups)
        all_groups += groups
    overall = summarize(all_groups)
    report: dict[str, Any] = {
        "run_id": runner.run_id,
        "model_path": cfg.model.path,
        "model_version": runner.model_version,
        "engine": cfg.explorer.engine,
        "workflow": cfg.explorer.workflow,
        "temperature": cfg.explorer.eval_temperature,
        "repeat_times": cfg.explorer.eval_repeat_times,
        "max_response_tokens": cfg.model.max_response_tokens,
        "seconds": time.perf_counter() - started,
        "created_unix": int(time.time()),
        "overall": overall,
        "tasksets": per_set,
    }
    path = report_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    metrics = {**overall, **{f"{k}/{name}": v for name, m in per_set.items() for k, v in m.items()}}
    runner._report("eval", metrics=metrics, message=f"bench at version {runner.model_version}: {path}")
    return path.resolve()


def _task_result(task: common_pb2.Task, batch: Sequence[common_pb2.Experience]) -> buffer_pb2.TaskResult:
    scored = [e for e in batch if not e.failed]
    rate = sum(e.reward >= PASS_THRESHOLD for e in scored) / len(scored) if scored else -1.0
    return buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id, pass_rate=rate, samples=len(scored))
