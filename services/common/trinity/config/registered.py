"""Field validators for the registry names a config uses (algorithm, workflow, reward, engine, ...).

Each name is checked against its kind's built-in table and the installed plugins
(`trinity.registry.check_name`), which imports no service code, so a typo fails when the config is
parsed (`explorer.workflow: unknown 'mathh'; known: ...`, exit 2) instead of when a service, after
loading its model, first looks the name up.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from pydantic import AfterValidator

from trinity.registry import check_name

COMPOSITE_PREFIX = "composite:"


def _reward(value: str) -> str:
    """`""` (the workflow's default), a reward name, or `composite:name=weight,...` over reward names."""
    if value.startswith(COMPOSITE_PREFIX):
        for part in parse_composite_reward(value):
            check_name("reward", part)
    elif value:
        check_name("reward", value)
    return value


def _loss_agg_mode(overrides: dict[str, Any]) -> dict[str, Any]:
    """Hyperparameter overrides of a loss: a `loss_agg_mode` among them must be a known mode."""
    mode = overrides.get("loss_agg_mode")
    if mode == "pair-mean":
        raise ValueError("loss_agg_mode: 'pair-mean' is DPO's mean over row pairs, not an aggregation of token losses")
    if mode is not None:
        try:
            check_name("loss_agg_mode", str(mode))
        except ValueError as err:
            raise ValueError(f"loss_agg_mode: {err}") from None
    return overrides


def parse_composite_reward(spec: str) -> dict[str, float]:
    """`composite:math=0.9,format=0.1` -> `{"math": 0.9, "format": 0.1}` (the explorer builds the reward)."""
    weights: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.removeprefix(COMPOSITE_PREFIX).split(","))):
        name, sep, weight = item.partition("=")
        if not sep:
            raise ValueError(f"composite reward part {item!r} must be name=weight (in {spec!r})")
        try:
            weights[name.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"composite reward part {item!r}: the weight is not a number (in {spec!r})") from None
    if not weights:
        raise ValueError(f"composite reward {spec!r} names no parts")
    return weights


AlgorithmName = Annotated[str, AfterValidator(partial(check_name, "algorithm"))]
WorkflowName = Annotated[str, AfterValidator(partial(check_name, "workflow"))]
EngineName = Annotated[str, AfterValidator(partial(check_name, "engine"))]
KLEstimatorName = Annotated[str, AfterValidator(partial(check_name, "kl_estimator"))]
ChatEnvironmentName = Annotated[str, AfterValidator(partial(check_name, "chat_environment"))]
StepEnvironmentName = Annotated[str, AfterValidator(partial(check_name, "step_environment"))]
AgentName = Annotated[str, AfterValidator(partial(check_name, "agent"))]
ToolName = Annotated[str, AfterValidator(partial(check_name, "tool"))]
OperatorName = Annotated[str, AfterValidator(partial(check_name, "operator"))]
# `difficulty` is no registry entry: the task set itself runs it, on the pass rates it keeps.
SelectorName = Annotated[str, AfterValidator(partial(check_name, "selector", also=("difficulty",)))]
RewardSpec = Annotated[str, AfterValidator(_reward)]
LossOverrides = Annotated[dict[str, float | int | str | bool], AfterValidator(_loss_agg_mode)]
