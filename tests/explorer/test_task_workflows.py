"""Each task's own workflow (`Task.workflow`): a mixed batch runs every task with its workflow, results in task
order, each name built once; no name means the run's workflow; an unknown name, or a workflow that cannot give the
run's algorithm what it needs, fails the tasks naming it. Scripted engines with a real tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from explorer_helpers import make_task

from trinity.config import RunConfig
from trinity.explorer.engines.base import GenerationRequest, GenerationResult
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.rollout_pool import RolloutLimits, RolloutPool
from trinity.explorer.workflows import MultiTurnWorkflow, RolloutSettings, create_workflow
from trinity.explorer.workflows.routing import TaskWorkflows, workflow_for_run
from trinity.explorer.workflows.single_turn import CountdownWorkflow, MathWorkflow
from trinity.v1 import common_pb2

SETTINGS = RolloutSettings(repeat_times=2)
SYSTEM = "Answer briefly."  # the run's workflow option: only the run's tasks are prompted with it


class CountingScripted(ScriptedEngine):
    """Math answers `\\boxed{7}`, countdown prompts get a right equation; counts generate calls."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, self.answer)
        self.calls = 0

    @staticmethod
    def answer(prompt: str) -> str:
        return "<answer>(6 - 2) * 3</answer>" if "create an equation" in prompt else r"\boxed{7}"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.calls += 1
        return super().generate(requests)


class ConcurrentScripted(CountingScripted):
    concurrent = True  # the pool runs each task's `run` in a worker of its own


def named(task_id: str, workflow: str) -> common_pb2.Task:
    """A task that is right for `math` (3+4) and for `countdown` (6, 2, 3 -> 12), naming `workflow`."""
    task = make_task(prompt="", answer="7", task_id=task_id, numbers=[6, 2, 3], target=12)
    task.prompt = "" if workflow == "countdown" else "What is 3+4?"
    task.workflow = workflow
    return task


def routed(built: list[str] | None = None) -> TaskWorkflows:
    """The run's `math` with a system prompt; other names built with their defaults (recorded in `built`)."""

    def build(name: str):
        if built is not None:
            built.append(name)
        return create_workflow(name)

    return TaskWorkflows(MathWorkflow(system_prompt=SYSTEM), "math", build)


MIXED = [named("set/0", ""), named("set/1", "countdown"), named("set/2", ""), named("set/3", "countdown")]


def test_a_mixed_batch_runs_each_task_with_its_own_workflow_in_task_order(tokenizer):
    built: list[str] = []
    workflows, engine = routed(built), CountingScripted(tokenizer)
    groups = workflows.run_batch(MIXED, engine, SETTINGS)
    assert [[e.task_id for e in group] for group in groups] == [[t.id, t.id] for t in MIXED]
    assert [(SYSTEM in g[0].prompt_text, "create an equation" in g[0].prompt_text) for g in groups] == [
        (True, False),
        (False, True),
        (True, False),
        (False, True),
    ]
    assert all(e.reward == 1.0 and not e.failed for group in groups for e in group)
    assert engine.calls == 2  # one batched call per workflow
    workflows.run_batch(MIXED, engine, SETTINGS)
    assert built == ["countdown"]  # once per name, for the run


def test_a_task_naming_the_run_workflow_gets_it_with_the_run_options():
    built: list[str] = []
    workflows = routed(built)
    run = workflows.run_workflow
    assert workflows.for_task(named("set/0", "math")) is run and workflows.for_task(named("set/1", "")) is run
    assert isinstance(workflows.for_task(named("set/2", "countdown")), CountdownWorkflow)
    assert built == ["countdown"]


@pytest.mark.parametrize("engine_type", [CountingScripted, ConcurrentScripted], ids=["batched", "concurrent"])
def test_the_rollout_pool_rolls_each_task_out_with_its_own_workflow(tokenizer, engine_type):
    rollouts = RolloutPool(routed(), engine_type(tokenizer), RolloutLimits()).run(MIXED, SETTINGS)
    assert [r.task.id for r in rollouts] == [t.id for t in MIXED] and not any(r.dropped for r in rollouts)
    prompts = [r.experiences[0].prompt_text for r in rollouts]
    assert ["create an equation" in p for p in prompts] == [False, True, False, True]
    assert all(e.reward == 1.0 for r in rollouts for e in r.experiences)


def test_an_unknown_workflow_name_fails_naming_the_task_and_the_known_workflows(tokenizer):
    tasks = [named("set/0", ""), named("set/1", "nope")]
    engine = CountingScripted(tokenizer)
    with pytest.raises(ValueError, match=r"task 'set/1' names workflow 'nope': unknown workflow 'nope'; known: .*math"):
        routed().run_batch(tasks, engine, SETTINGS)
    assert engine.calls == 0  # every name is resolved before anything runs
    rollouts = RolloutPool(routed(), engine, RolloutLimits(retries=1)).run(tasks, SETTINGS)
    assert [r.drop_reason for r in rollouts] == ["", "error:ValueError"]  # the rest of the batch is kept
    assert "unknown workflow 'nope'" in str(rollouts[1].error)


def _config(algorithm: str, workflow: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"path": "unused"},
            "algorithm": {"algorithm_type": algorithm},
            "buffer": {"taskset": {"path": "unused.jsonl"}},
            "explorer": {"workflow": workflow},
        }
    )


def test_a_task_workflow_that_cannot_feed_the_run_algorithm_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'remax' needs per-row reward_baselines, which workflow 'multi_turn'"):
        workflow_for_run(_config("remax", "math"), "multi_turn")
    with pytest.raises(ValueError, match=r"'multi_step_grpo' needs per-row episode_ids, which workflow 'math'"):
        workflow_for_run(_config("multi_step_grpo", "frozen_lake"), "math")
    assert isinstance(workflow_for_run(_config("remax", "math"), "countdown"), CountdownWorkflow)
    assert isinstance(workflow_for_run(_config("grpo", "math"), "multi_turn"), MultiTurnWorkflow)
