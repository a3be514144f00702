"""FrozenLake (gymnasium's real environment) as a text game for `MultiStepWorkflow`.

Task payload (all optional): `map` (list of rows over S/F/H/G, default gymnasium's 4x4),
`size` + `map_seed` (a random solvable map instead), `is_slippery` (default false).
"""

from __future__ import annotations

import re
from typing import Any

from trinity.explorer.workflows.base import WORKFLOWS
from trinity.explorer.workflows.multi_step import (
    STEP_ENVIRONMENTS,
    MultiStepWorkflow,
    StepEnvironment,
    StepOutcome,
)
from trinity.v1 import common_pb2

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}  # gymnasium's action ids
DEFAULT_MAP = ("SFFF", "FHFH", "FFFH", "HFFG")
_ACTION_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)
_ANSWER = re.compile(r"<answer>\s*(\w+)\s*</answer>", re.IGNORECASE)

# No request to reason first: at the example's 32 response tokens a small model's reasoning is cut before its move.
INSTRUCTIONS = (
    "You are playing FrozenLake on a grid. P is you, F is frozen ice (safe), H is a hole (falling in "
    "ends the game), G is the goal (reaching it wins). Reply with one move: Left, Down, Right or Up."
)


def parse_action(text: str) -> int | None:
    """The move in `<answer>` if present, else the last move word in the reply; None if there is none."""
    tagged = _ANSWER.findall(text)
    if tagged:
        return ACTIONS.get(tagged[-1].lower())
    words = _ACTION_WORD.findall(text)
    return ACTIONS[words[-1].lower()] if words else None


def _task_map(task: common_pb2.Task) -> list[str]:
    fields = task.payload.fields
    if "map" in fields:
        return [v.string_value for v in fields["map"].list_value.values]
    if "size" in fields:
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        seed = int(fields["map_seed"].number_value) if "map_seed" in fields else 0
        return list(generate_random_map(size=int(fields["size"].number_value), seed=seed))
    return list(DEFAULT_MAP)


@STEP_ENVIRONMENTS.register("frozen_lake")
class FrozenLakeEnvironment(StepEnvironment):
    """Wraps `gymnasium.make("FrozenLake-v1")`; an unparseable reply is an invalid move (no env step)."""

    instructions = INSTRUCTIONS

    def __init__(self, task: common_pb2.Task, invalid_action_reward: float = 0.0) -> None:
        import gymnasium as gym

        self.desc = _task_map(task)
        fields = task.payload.fields
        slippery = bool(fields["is_slippery"].bool_value) if "is_slippery" in fields else False
        self.env: Any = gym.make("FrozenLake-v1", desc=self.desc, is_slippery=slippery)
        self.invalid_action_reward = invalid_action_reward
        self.position = 0

    def reset(self, task: common_pb2.Task, seed: int) -> str:
        self.position, _ = self.env.reset(seed=seed)
        return self.render()

    def step(self, action_text: str) -> StepOutcome:
        action = parse_action(action_text)
        if action is None:
            note = "Invalid move; answer with one of Left, Down, Right, Up.\n"
            return StepOutcome(note + self.render(), self.invalid_action_reward, False, {"invalid_action": True})
        self.position, reward, terminated, truncated, _ = self.env.step(action)
        success = terminated and reward > 0
        return StepOutcome(self.render(), float(reward), bool(terminated or truncated), {"success": success})

    def state_key(self) -> str:
        # The map is fixed per task, so the position alone identifies the state within a group.
        return f"pos={self.position}"

    def render(self) -> str:
        ncol = len(self.desc[0])
        row, col = divmod(int(self.position), ncol)
        grid = [list(line) for line in self.desc]
        grid[row][col] = "P"
        return "Current map:\n" + "\n".join("".join(line) for line in grid)

    def close(self) -> None:
        self.env.close()


@WORKFLOWS.register("frozen_lake")
class FrozenLakeWorkflow(MultiStepWorkflow):
    """`multi_step` on FrozenLake; `invalid_action_reward` (e.g. -0.1) is the step reward of a reply with no move."""

    def __init__(self, max_steps: int = 20, gamma: float = 1.0, invalid_action_reward: float = 0.0) -> None:
        super().__init__(
            environment=lambda task: FrozenLakeEnvironment(task, invalid_action_reward=invalid_action_reward),
            max_steps=max_steps,
            gamma=gamma,
        )
