"""The workflow contract and the helpers every workflow shares to build `Experience` messages.

A workflow turns one `Task` into experiences: it runs the task `repeat_times` times with an
engine, scores the results, and gives every experience of that run one `group_id`. The weight
version on each experience is the one the engine reports for the generate call that produced it
(exact even if weights change between the calls of a multi-step episode).
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from trinity.explorer.engines.base import Engine, SamplingSettings
from trinity.explorer.rewards import RewardFn, RewardOutcome, evaluate_reward, get_reward
from trinity.explorer.rewards.judge import GroupReward
from trinity.explorer.rewards.judge_client import JudgeSettings
from trinity.registry import Registry
from trinity.runtime.spans import Envelope
from trinity.v1 import common_pb2


@dataclass(frozen=True)
class RolloutSettings:
    """How to run a task: repeats (the GRPO group size), sampling, the reward time limit, the judge if any."""

    repeat_times: int = 1
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    reward_timeout_s: float = 10.0
    run_id: str = ""
    judge: JudgeSettings | None = None  # for the judge rewards (`explorer.judge`)
    greedy_baseline: bool = False  # ReMax: one greedy sample per task, its reward on every row as `reward_baseline`
    reward_clock: Envelope | None = None  # times the step's reward calls (`reward_timer`): the timeline's reward span


class Workflow(ABC):
    """Runs one task; subclasses register with `@WORKFLOWS.register(name)`."""

    default_reward: str = ""
    supports_greedy_baseline: bool = False  # can add the greedy sample ReMax's baseline needs

    @abstractmethod
    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        """All experiences of `settings.repeat_times` runs of `task`, sharing one group id."""

    def run_batch(
        self, tasks: Sequence[common_pb2.Task], engine: Engine, settings: RolloutSettings
    ) -> list[list[common_pb2.Experience]]:
        """Every task's experiences; workflows that can batch generation across tasks override this."""
        return [self.run(task, engine, settings) for task in tasks]

    def reward_fn(self, task: common_pb2.Task) -> RewardFn:
        """The task's own reward if it names one, else this workflow's default."""
        name = task.reward_fn or self.default_reward
        if not name:
            raise ValueError(f"task {task.id!r} names no reward_fn and {type(self).__name__} has no default")
        return get_reward(name)


WORKFLOWS: Registry[type[Workflow]] = Registry("workflow")


def needs_package(package: str, extra: str, user: str) -> None:
    """ValueError naming the install command when `package`, an optional dependency of `user`, is missing (the
    explorer's images leave the `extra` out: it is large, see docs/explorer.md)."""
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"{user} needs the {package} package: pip install 'trinity-explorer[{extra}]'")


def new_id() -> str:
    return uuid.uuid4().hex


def new_experience(
    task: common_pb2.Task,
    settings: RolloutSettings,
    *,
    group_id: str,
    model_version: int,
    prompt_token_ids: Sequence[int],
    response_token_ids: Sequence[int],
    logprobs: Sequence[float],
    action_mask: Sequence[bool] | None = None,
    prompt_text: str = "",
    response_text: str = "",
    finish_reason: str = "",
) -> common_pb2.Experience:
    """A ROLLOUT experience with ids, provenance and tokens filled in (reward still 0).

    `logprobs` and `action_mask` are [resp_len]; the mask defaults to all true (all model tokens).
    """
    if len(logprobs) != len(response_token_ids):
        raise ValueError(f"{len(logprobs)} logprobs for {len(response_token_ids)} response tokens")
    mask = [True] * len(response_token_ids) if action_mask is None else list(action_mask)
    if len(mask) != len(response_token_ids):
        raise ValueError(f"action_mask has {len(mask)} entries for {len(response_token_ids)} response tokens")
    exp = common_pb2.Experience(
        id=new_id(),
        kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
        run_id=settings.run_id,
        taskset=task.taskset,
        task_id=task.id,
        group_id=group_id,
        model_version=model_version,
        prompt_token_ids=list(prompt_token_ids),
        response_token_ids=list(response_token_ids),
        logprobs=list(logprobs),
        action_mask=mask,
        prompt_text=prompt_text,
        response_text=response_text,
        finish_reason=finish_reason,
        created_unix_ms=int(time.time() * 1000),
    )
    exp.metrics["response_tokens"] = float(len(response_token_ids))
    exp.metrics["truncated"] = 1.0 if finish_reason == "length" else 0.0
    return exp


def reward_timer(settings: RolloutSettings) -> AbstractContextManager[None]:
    """`with reward_timer(settings):` around a workflow's reward calls, so that the step's timeline shows them."""
    return settings.reward_clock.timed() if settings.reward_clock is not None else nullcontext()


def score(
    exp: common_pb2.Experience, fn: RewardFn, response_text: str, task: common_pb2.Task, timeout_s: float
) -> None:
    """Set the reward fields of `exp`; a failing reward marks it failed instead of raising."""
    apply_outcome(exp, evaluate_reward(fn, response_text, task, timeout_s))


def score_group(
    experiences: Sequence[common_pb2.Experience],
    fn: RewardFn,
    response_texts: Sequence[str],
    task: common_pb2.Task,
    settings: RolloutSettings,
) -> None:
    """Score every response to `task`: together when the reward judges a group, else one by one."""
    if not isinstance(fn, GroupReward):
        with reward_timer(settings):
            for exp, text in zip(experiences, response_texts, strict=True):
                score(exp, fn, text, task, settings.reward_timeout_s)
        return
    with reward_timer(settings):
        outcomes = fn.score_group(response_texts, task, settings.judge)
    for exp, outcome in zip(experiences, outcomes, strict=True):
        apply_outcome(exp, outcome)


def set_baseline(
    experiences: Sequence[common_pb2.Experience],
    fn: RewardFn,
    greedy_text: str,
    task: common_pb2.Task,
    settings: RolloutSettings,
) -> None:
    """ReMax's baseline: the reward of the greedy response, on every row of the group (`reward_baseline`).

    A baseline whose reward fails is 0, and the rows say so (`metrics["baseline_failed"]`), so the advantage
    degrades to the plain reward instead of the group being lost.
    """
    with reward_timer(settings):
        outcome = evaluate_reward(fn, greedy_text, task, settings.reward_timeout_s)
    for exp in experiences:
        exp.reward_components["reward_baseline"] = 0.0 if outcome.failed else outcome.reward
        exp.metrics["baseline_failed"] = float(outcome.failed)


def apply_outcome(exp: common_pb2.Experience, outcome: RewardOutcome) -> None:
    exp.reward = outcome.reward
    exp.reward_components.update(outcome.components)
    if outcome.failed:
        exp.failed = True
        exp.error = outcome.error


def task_messages(task: common_pb2.Task, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat to prompt with: the task's messages if given, else its prompt as one user turn."""
    if task.messages:
        return [{"role": m.role, "content": m.content} for m in task.messages]
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": task.prompt})
    return messages
