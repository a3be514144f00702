"""Single-turn workflows: one prompt, `repeat_times` sampled answers, one reward each."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trinity.explorer.engines.base import Engine, GenerationRequest
from trinity.explorer.rewards.countdown import countdown_numbers
from trinity.explorer.workflows.base import (
    WORKFLOWS,
    RolloutSettings,
    Workflow,
    new_experience,
    new_id,
    score_group,
    set_baseline,
    task_messages,
)
from trinity.v1 import common_pb2


@WORKFLOWS.register("math")
class MathWorkflow(Workflow):
    """Question -> answer; scored by `math` (boxed / last-number answer, symbolic equivalence)."""

    default_reward = "math"
    supports_greedy_baseline = True

    def __init__(self, system_prompt: str | None = None, use_chat_template: bool = True) -> None:
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template

    def prompt_text(self, task: common_pb2.Task) -> str:
        return task.prompt

    def request(self, task: common_pb2.Task, settings: RolloutSettings) -> GenerationRequest:
        n, sampling = settings.repeat_times, settings.sampling
        if self.use_chat_template or task.messages:
            prompt_task = common_pb2.Task()
            prompt_task.CopyFrom(task)
            prompt_task.prompt = self.prompt_text(task)
            return GenerationRequest(messages=task_messages(prompt_task, self.system_prompt), n=n, sampling=sampling)
        return GenerationRequest(prompt=self.prompt_text(task), n=n, sampling=sampling)

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        return self.run_batch([task], engine, settings)[0]

    def run_batch(
        self, tasks: Sequence[common_pb2.Task], engine: Engine, settings: RolloutSettings
    ) -> list[list[common_pb2.Experience]]:
        """One engine call for the whole batch: the engine schedules every sample of every task together."""
        requests = [self.request(task, settings) for task in tasks]
        if settings.greedy_baseline:  # in the same engine call, so the baseline comes from the same weights
            greedy = dataclasses.replace(settings.sampling, temperature=0.0)
            requests += [dataclasses.replace(r, n=1, sampling=greedy) for r in requests]
        results = engine.generate(requests)
        baselines = results[len(tasks) :]
        batches: list[list[common_pb2.Experience]] = []
        for task, result in zip(tasks, results[: len(tasks)], strict=True):
            reward_fn = self.reward_fn(task)
            group_id = new_id()
            experiences = []
            for sample in result.samples:
                exp = new_experience(
                    task,
                    settings,
                    group_id=group_id,
                    model_version=result.model_version,
                    prompt_token_ids=result.prompt_token_ids,
                    response_token_ids=sample.token_ids,
                    logprobs=sample.logprobs,
                    prompt_text=result.prompt_text,
                    response_text=sample.text,
                    finish_reason=sample.finish_reason,
                )
                experiences.append(exp)
            score_group(experiences, reward_fn, [s.text for s in result.samples], task, settings)
            if baselines:
                set_baseline(experiences, reward_fn, baselines[len(batches)].samples[0].text, task, settings)
            batches.append(experiences)
        return batches


COUNTDOWN_PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number exactly once. Show your work in <think> </think> tags and "
    "return the final equation in <answer> </answer> tags, for example <answer>(1 + 2) / 3</answer>."
)


@WORKFLOWS.register("countdown")
class CountdownWorkflow(MathWorkflow):
    """Numbers + target -> equation; the prompt is built from the payload when the task has none."""

    default_reward = "countdown"

    def prompt_text(self, task: common_pb2.Task) -> str:
        if task.prompt:
            return task.prompt
        numbers, target = countdown_numbers(task)
        return COUNTDOWN_PROMPT.format(numbers=numbers, target=target)
