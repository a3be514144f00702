"""Workflows by registry name: `math`, `countdown`, `multi_turn`, `react`, `multi_step`, `frozen_lake`,
`textworld`, `scienceworld`."""

import inspect
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
    """Build the workflow registered as `name` with its options as keyword arguments.

    Built-in workflows' options are checked by the config (`trinity.config.explorer.WORKFLOW_OPTIONS`);
    a plugin's are checked here, against its constructor, so a wrong key names the workflow's keys.
    """
    workflow = WORKFLOWS.get(name)
    try:
        inspect.signature(workflow).bind(**options)
    except TypeError as err:
        takes = ", ".join(inspect.signature(workflow).parameters) or "no options"
        raise ValueError(f"explorer.workflow_options: {err} (workflow {name!r} takes: {takes})") from None
    return workflow(**options)


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
