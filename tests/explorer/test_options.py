"""Explorer options: the config's typed shapes match what the workflows take; wrong keys are named."""

from __future__ import annotations

import inspect

import pytest

from trinity.config import ConfigError, RunConfig, parse_run_config
from trinity.config.explorer import WORKFLOW_OPTIONS, FrozenLakeWorkflowOptions, TransformersEngineOptions
from trinity.explorer.workflows import WORKFLOWS, create_workflow
from trinity.explorer.workflows.base import Workflow
from trinity.v1 import common_pb2

BENCH = "mode: bench\nmodel: {path: m}\nbuffer: {eval_tasksets: [{path: eval.jsonl}]}\n"


@WORKFLOWS.register("test_plugin_workflow")
class PluginWorkflow(Workflow):
    """A workflow the config has no options shape for: its options are checked when it is built."""

    def __init__(self, turns: int = 1) -> None:
        self.turns = turns

    def run(self, task, engine, settings) -> list[common_pb2.Experience]:
        return []


@pytest.mark.parametrize("name", sorted(WORKFLOW_OPTIONS))
def test_each_builtin_workflow_takes_exactly_its_config_options_with_the_same_defaults(name):
    params = inspect.signature(WORKFLOWS.get(name)).parameters
    fields = WORKFLOW_OPTIONS[name].model_fields
    assert {p: params[p].default for p in params} == {f: fields[f].default for f in fields}


def test_the_workflow_picks_the_shape_of_its_options():
    config = parse_run_config(BENCH + "explorer: {workflow: frozen_lake, workflow_options: {max_steps: 6}}")
    assert config.explorer.workflow_options == FrozenLakeWorkflowOptions(max_steps=6)


def test_an_unknown_workflow_option_names_the_workflow_and_its_fields():
    with pytest.raises(
        ConfigError,
        match=r"max_turns: unknown field \(for workflow 'frozen_lake'; "
        r"its fields: max_steps, gamma, invalid_action_reward\)",
    ):
        parse_run_config(BENCH + "explorer: {workflow: frozen_lake, workflow_options: {max_turns: 3}}")


def test_the_engine_picks_the_shape_of_its_options():
    config = parse_run_config(BENCH + "explorer: {engine: transformers, engine_options: {device: cpu}}")
    assert config.explorer.engine_options == TransformersEngineOptions(device="cpu")
    with pytest.raises(ConfigError, match=r"max_model_len: unknown field \(for engine 'transformers'"):
        parse_run_config(BENCH + "explorer: {engine: transformers, engine_options: {max_model_len: 64}}")


def test_options_survive_the_json_the_gateway_hands_the_explorer():
    config = parse_run_config(BENCH + "explorer: {engine_options: {dtype: bfloat16}, workflow: multi_turn}")
    again = RunConfig.model_validate_json(config.model_dump_json())
    assert again.explorer == config.explorer


def test_a_stage_may_switch_the_engine_without_inheriting_the_other_engines_defaults():
    config = parse_run_config(BENCH + "stages: [{explorer: {engine: transformers}}]")
    _, stage = config.stage_configs()
    assert stage.explorer.engine_options == TransformersEngineOptions()


def test_a_plugin_workflow_option_the_constructor_lacks_names_what_it_takes():
    with pytest.raises(ValueError, match=r"workflow 'test_plugin_workflow' takes: turns"):
        create_workflow("test_plugin_workflow", rounds=3)
