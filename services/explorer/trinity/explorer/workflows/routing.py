"""Each task's own workflow: a task may name one (`Task.workflow`, from a task set's `workflow_key`).

`TaskWorkflows` is a `Workflow` that runs every task with the workflow it names, built on first use by `build`
(`workflow_for_run`: the registered workflow with its default options) and kept for the run; an empty name, or
the run's own workflow name, means the run's workflow, options and all. A batch is split by workflow, each part
runs in one `run_batch` of its workflow, and the results come back in task order. A name that cannot be built
(unknown, or refused by `build`: it cannot give the run's algorithm what it needs) raises, naming the task, for
every task that names it: a rollout error, like a workflow refusing a task's shape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from trinity.config import RunConfig
from trinity.explorer.engines.base import Engine
from trinity.explorer.rewards import RewardFn
from trinity.explorer.workflows import create_workflow
from trinity.explorer.workflows.base import RolloutSettings, Workflow
from trinity.v1 import common_pb2

WorkflowBuilder = Callable[[str], Workflow]


class TaskWorkflows(Workflow):
    """Routes each task to its workflow; its own `default_reward` and `supports_greedy_baseline` are the run's."""

    def __init__(self, run_workflow: Workflow, run_name: str, build: WorkflowBuilder) -> None:
        self.run_workflow = run_workflow
        self.default_reward = run_workflow.default_reward
        self.supports_greedy_baseline = run_workflow.supports_greedy_baseline
        self._build = build
        self._named: dict[str, Workflow] = {run_name: run_workflow}
        self._lock = threading.Lock()  # rollouts of a batching engine resolve their workflows from many threads

    def for_task(self, task: common_pb2.Task) -> Workflow:
        """The workflow `task` names, built once per name; the run's when it names none."""
        name = task.workflow
        if not name:
            return self.run_workflow
        with self._lock:
            if name not in self._named:
                try:
                    self._named[name] = self._build(name)
                except Exception as err:
                    raise ValueError(f"task {task.id!r} names workflow {name!r}: {err}") from err
            return self._named[name]

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        return self.for_task(task).run(task, engine, settings)

    def run_batch(
        self, tasks: Sequence[common_pb2.Task], engine: Engine, settings: RolloutSettings
    ) -> list[list[common_pb2.Experience]]:
        """One `run_batch` per workflow over its tasks (every name resolved before any runs); in task order."""
        workflows = [self.for_task(task) for task in tasks]
        parts: dict[int, tuple[Workflow, list[int]]] = {}  # by workflow identity: its tasks' indices, in order
        for i, workflow in enumerate(workflows):
            parts.setdefault(id(workflow), (workflow, []))[1].append(i)
        results: list[list[common_pb2.Experience]] = [[] for _ in tasks]
        for workflow, indices in parts.values():
            batches = workflow.run_batch([tasks[i] for i in indices], engine, settings)
            for i, experiences in zip(indices, batches, strict=True):
                results[i] = experiences
        return results

    def reward_fn(self, task: common_pb2.Task) -> RewardFn:
        return self.for_task(task).reward_fn(task)


def workflow_for_run(config: RunConfig, name: str) -> Workflow:
    """Workflow `name` with its default options, refused when it cannot give the run's algorithm what it needs
    (the run-level checks of the run's own workflow: `RunConfig.unfed_inputs`, `needs_greedy_baseline`)."""
    algorithm = config.algorithm
    unfed = config.unfed_inputs(name)
    if unfed:
        raise ValueError(
            f"algorithm.algorithm_type {algorithm.algorithm_type!r} needs per-row "
            f"{', '.join(r.value for r in unfed)}, which workflow {name!r} does not supply"
        )
    workflow = create_workflow(name)
    if algorithm.preset.greedy_baseline and not workflow.supports_greedy_baseline:
        raise ValueError(
            f"algorithm.algorithm_type {algorithm.algorithm_type!r} needs a greedy baseline sample per task, "
            f"which workflow {name!r} cannot produce (use a single-turn workflow: math, countdown)"
        )
    return workflow
