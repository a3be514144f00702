"""ScienceWorld (AllenAI's science-experiment simulator, a Java engine shipped in its wheel) for `MultiStepWorkflow`.

Task payload: `task_name` (one of ScienceWorld's tasks, e.g. `boil`, `find-living-thing`), `variation` (default 0) and
`simplifications` (ScienceWorld's simplification string, e.g. `easy` or `teleportAction,openDoors`; default none).

The observation is ScienceWorld's feedback, the task description and its valid actions (the first
`max_listed_actions` of its list, with a note of how many more there are). The action is the reply's last
`<answer>`, else its last line, sent to ScienceWorld as text; a reply ScienceWorld does not parse as an action
is an invalid action (its world does not change). ScienceWorld's score runs 0..100 and a task starts with some
points already (8 of `find-living-thing`'s); the reward of a step is its score increase over the points still to
earn, `(score - previous) / (100 - starting score)`, so a completed task returns 1. The episode is done when
ScienceWorld says so: completed (score 100, `info["success"]`) or failed (a wrong `focus on`: its score drops to
-100), which counts as the starting score, so a failed episode returns 0, no progress. `state_key` hashes
ScienceWorld's `look` and inventory texts. Each environment runs its own JVM, started in the constructor and
stopped in `close()`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trinity.explorer.workflows.base import WORKFLOWS, needs_package
from trinity.explorer.workflows.multi_step import (
    STEP_ENVIRONMENTS,
    MultiStepWorkflow,
    StepEnvironment,
    StepOutcome,
)
from trinity.explorer.workflows.textworld import parse_command
from trinity.v1 import common_pb2

MAX_SCORE = 100.0
UNPARSED = "No known action matches that input."  # ScienceWorld's reply to text that is no action

INSTRUCTIONS = (
    "You are an agent in ScienceWorld, a simulated world for science experiments. Each turn you see what happened, "
    "your task and actions you can take. Answer with exactly one action, as <answer>open door to kitchen</answer>."
)


@STEP_ENVIRONMENTS.register("scienceworld")
class ScienceWorldEnvironment(StepEnvironment):
    """One episode of a ScienceWorld task variation."""

    instructions = INSTRUCTIONS

    def __init__(self, task: common_pb2.Task, max_listed_actions: int = 50, invalid_action_reward: float = 0.0) -> None:
        needs_package("scienceworld", "text-games", "the scienceworld environment")
        fields = task.payload.fields
        if "task_name" not in fields or not fields["task_name"].string_value:
            raise ValueError("payload.task_name: required (a ScienceWorld task, e.g. 'boil')")
        self.task_name = fields["task_name"].string_value
        variation = fields["variation"].number_value if "variation" in fields else 0.0
        if variation != int(variation) or variation < 0:
            raise ValueError(f"payload.variation: a whole number >= 0 (got {variation})")
        self.variation = int(variation)
        self.simplifications = fields["simplifications"].string_value if "simplifications" in fields else ""
        self.max_listed_actions = max_listed_actions
        self.invalid_action_reward = invalid_action_reward
        from scienceworld import ScienceWorldEnv

        self.env: Any = ScienceWorldEnv("")
        try:
            self._check_task()
        except BaseException:
            self.env.close()
            raise
        self.start_score = self.score = 0.0
        self.info: dict[str, Any] = {}

    def _check_task(self) -> None:
        names = self.env.get_task_names()
        if self.task_name not in names:
            raise ValueError(
                f"payload.task_name: unknown ScienceWorld task {self.task_name!r}; known: {', '.join(names)}"
            )
        variations = self.env.get_max_variations(self.task_name)
        if self.variation >= variations:
            raise ValueError(f"payload.variation: {self.task_name!r} has variations 0..{variations - 1}")

    def reset(self, task: common_pb2.Task, seed: int) -> str:
        # A variation is one fixed world: the seed has nothing to vary.
        self.env.load(self.task_name, self.variation, self.simplifications)
        observation, self.info = self.env.reset()
        self.start_score = self.score = float(self.info["score"])
        return self.render(observation)

    def step(self, action_text: str) -> StepOutcome:
        command = parse_command(action_text)
        observation, _, completed, info = self.env.step(command)
        if observation.strip() == UNPARSED:
            note = f"{command!r} is not an action ScienceWorld knows; answer with one of the valid actions.\n\n"
            return StepOutcome(
                note + self.render(observation), self.invalid_action_reward, False, {"invalid_action": True}
            )
        self.info = info
        score = float(info["score"])
        if score < 0:  # -100 marks a failed task: counted as no progress
            score = self.start_score
        reward = (score - self.score) / max(MAX_SCORE - self.start_score, 1.0)
        self.score = score
        success = bool(completed) and score >= MAX_SCORE
        return StepOutcome(self.render(observation), reward, bool(completed), {"success": success})

    def state_key(self) -> str:
        text = f"{self.info.get('look', '')}\n{self.info.get('inv', '')}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def render(self, observation: str) -> str:
        valid = list(self.info.get("valid", []))
        listed = "\n".join(f"- {a}" for a in valid[: self.max_listed_actions])
        more = len(valid) - self.max_listed_actions
        note = f"\n(and {more} more valid actions not listed)" if more > 0 else ""
        return f"{observation.strip()}\n\nTask: {self.info.get('taskDesc', '')}\n\nValid actions:\n{listed}{note}"

    def close(self) -> None:
        self.env.close()
        # close() only asks the JVM to exit; waiting for it keeps JVMs from piling up, and ScienceWorldEnv's
        # __del__, which closes again, from writing to the dead JVM's pipe.
        self.env._gateway.java_process.wait(timeout=30)


@WORKFLOWS.register("scienceworld")
class ScienceWorldWorkflow(MultiStepWorkflow):
    """`multi_step` on ScienceWorld; `max_listed_actions` bounds the valid actions an observation lists;
    `invalid_action_reward` is the step reward of an action the world does not accept."""

    def __init__(
        self, max_steps: int = 20, gamma: float = 1.0, max_listed_actions: int = 50, invalid_action_reward: float = 0.0
    ) -> None:
        needs_package("scienceworld", "text-games", "the scienceworld workflow")
        super().__init__(
            environment=lambda task: ScienceWorldEnvironment(
                task, max_listed_actions=max_listed_actions, invalid_action_reward=invalid_action_reward
            ),
            max_steps=max_steps,
            gamma=gamma,
        )
