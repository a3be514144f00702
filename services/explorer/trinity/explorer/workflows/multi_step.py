"""Multi-step agents: an environment adapter (reset / step) driven by the model, one experience per step.

To plug in an environment (ALFWorld, WebShop, SciWorld, ...), subclass `StepEnvironment`, register a
factory with `@STEP_ENVIRONMENTS.register(name)`, and run the `multi_step` workflow with
`environment=name` (or register a `MultiStepWorkflow` subclass under its own workflow name, as
`frozen_lake` does). See docs/explorer.md.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trinity.explorer.engines.base import Engine, GenerationRequest, GenerationResult
from trinity.explorer.workflows.base import WORKFLOWS, RolloutSettings, Workflow, new_experience, new_id
from trinity.registry import Registry
from trinity.v1 import common_pb2


@dataclass
class StepOutcome:
    """What one action led to. `done` ends the episode (terminal state or the env's own time limit)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)  # "success": bool and "invalid_action": bool are read


class StepEnvironment(ABC):
    """An adapter from an environment to text: observations out, model replies in."""

    #: The system prompt: rules, the action syntax the parser expects.
    instructions: str = ""

    @abstractmethod
    def reset(self, task: common_pb2.Task, seed: int) -> str:
        """Start an episode of `task`; returns the first observation as text."""

    @abstractmethod
    def step(self, action_text: str) -> StepOutcome:
        """Apply the model's whole reply (the adapter parses the action out of it)."""

    def state_key(self) -> str:
        """A key of the current state, equal for equal states across episodes (GiGPO anchor states)."""
        return ""

    def close(self) -> None:  # noqa: B027 - adapters without resources need nothing
        """Release the environment's resources."""


StepEnvironmentFactory = Callable[[common_pb2.Task], StepEnvironment]
STEP_ENVIRONMENTS: Registry[StepEnvironmentFactory] = Registry("step_environment")


@dataclass
class _Step:
    result: GenerationResult
    state_key: str
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class _Episode:
    env: StepEnvironment
    observation: str
    steps: list[_Step] = field(default_factory=list)
    done: bool = False
    ended_by: str = "max_steps"


@WORKFLOWS.register("multi_step")
class MultiStepWorkflow(Workflow):
    """Runs `repeat_times` episodes in lockstep (one batched generate per step).

    Each step's prompt is the environment's instructions (system) and the current observation
    (user). Every step becomes one experience with `episode_id`, `step_index` and `state_key`;
    `reward` is the episode return (trajectory-level algorithms group on it), and the components
    hold `step_reward`, `return_to_go` (discounted by `gamma`) and `episode_return`.
    """

    def __init__(
        self,
        environment: str | StepEnvironmentFactory = "frozen_lake",
        max_steps: int = 20,
        gamma: float = 1.0,
    ) -> None:
        self.env_factory = STEP_ENVIRONMENTS.get(environment) if isinstance(environment, str) else environment
        self.max_steps = max_steps
        self.gamma = gamma

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        base_seed = zlib.crc32(task.id.encode())
        episodes = []
        for r in range(settings.repeat_times):
            env = self.env_factory(task)
            episodes.append(_Episode(env, env.reset(task, seed=base_seed + r)))
        try:
            for _ in range(self.max_steps):
                active = [ep for ep in episodes if not ep.done]
                if not active:
                    break
                requests = [self._request(ep, settings) for ep in active]
                for ep, result in zip(active, engine.generate(requests), strict=True):
                    self._advance(ep, result)
        finally:
            for ep in episodes:
                ep.env.close()
        group_id = new_id()
        return [exp for ep in episodes for exp in self._experiences(task, settings, group_id, ep)]

    def _request(self, ep: _Episode, settings: RolloutSettings) -> GenerationRequest:
        messages = [{"role": "user", "content": ep.observation}]
        if ep.env.instructions:
            messages.insert(0, {"role": "system", "content": ep.env.instructions})
        return GenerationRequest(messages=messages, sampling=settings.sampling)

    def _advance(self, ep: _Episode, result: GenerationResult) -> None:
        step = _Step(result=result, state_key=ep.env.state_key())
        ep.steps.append(step)
        try:
            outcome = ep.env.step(result.samples[0].text)
        except Exception as e:  # noqa: BLE001 - an env bug ends this episode, not the explorer
            step.error = f"environment step failed: {type(e).__name__}: {e}"
            ep.done, ep.ended_by = True, "error"
            return
        step.reward, step.info = outcome.reward, outcome.info
        ep.observation = outcome.observation
        if outcome.done:
            ep.done, ep.ended_by = True, "environment"

    def _experiences(
        self, task: common_pb2.Task, settings: RolloutSettings, group_id: str, ep: _Episode
    ) -> list[common_pb2.Experience]:
        episode_id = new_id()
        episode_return = sum(s.reward for s in ep.steps)
        success = any(s.info.get("success") for s in ep.steps)
        to_go, returns = 0.0, []
        for s in reversed(ep.steps):
            to_go = s.reward + self.gamma * to_go
            returns.append(to_go)
        returns.reverse()
        out = []
        for index, (s, ret) in enumerate(zip(ep.steps, returns, strict=True)):
            sample = s.result.samples[0]
            exp = new_experience(
                task,
                settings,
                group_id=group_id,
                model_version=s.result.model_version,
                prompt_token_ids=s.result.prompt_token_ids,
                response_token_ids=sample.token_ids,
                logprobs=sample.logprobs,
                prompt_text=s.result.prompt_text,
                response_text=sample.text,
                finish_reason=sample.finish_reason,
            )
            exp.episode_id, exp.step_index, exp.state_key = episode_id, index, s.state_key
            exp.reward = episode_return
            exp.reward_components.update(step_reward=s.reward, return_to_go=ret, episode_return=episode_return)
            exp.metrics.update(
                episode_length=float(len(ep.steps)),
                success=float(success),
                invalid_action=float(bool(s.info.get("invalid_action"))),
            )
            exp.info["ended_by"] = ep.ended_by
            if s.error:
                exp.failed, exp.error = True, s.error
            out.append(exp)
        return out
