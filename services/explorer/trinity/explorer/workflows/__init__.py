"""Workflows by registry name: `math`, `countdown`, `multi_turn`, `multi_step`, `frozen_lake`."""

from typing import Any

from trinity.explorer.workflows.base import WORKFLOWS, RolloutSettings, Workflow, new_experience, score
from trinity.explorer.workflows.multi_step import (
    STEP_ENVIRONMENTS,
    MultiStepWorkflow,
    StepEnvironment,
    StepOutcome,
)
from trinity.explorer.workflows.multi_turn import (
    CHAT_ENVIRONMENTS,
    ChatEnvironment,
    EnvReply,
    MultiTurnWorkflow,
)


def create_workflow(name: str, **options: Any) -> Workflow:
    """Build the workflow registered as `name` with its options as keyword arguments."""
    return WORKFLOWS.get(name)(**options)


__all__ = [
    "CHAT_ENVIRONMENTS",
    "STEP_ENVIRONMENTS",
    "WORKFLOWS",
    "ChatEnvironment",
    "EnvReply",
    "MultiStepWorkflow",
    "MultiTurnWorkflow",
    "RolloutSettings",
    "StepEnvironment",
    "StepOutcome",
    "Workflow",
    "create_workflow",
    "new_experience",
    "score",
]
