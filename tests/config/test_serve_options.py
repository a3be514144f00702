"""The serve-mode keys that decide how a serve run ends: where `keep_serving_after_last_step` may be set."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trinity.config import RunConfig
from trinity.config.errors import ConfigError

SERVE = {"name": "agent", "mode": "serve", "model": {"path": "m"}}
SERVE_ON = {"explorer": {"keep_serving_after_last_step": True}}


def test_keeping_on_serving_is_refused_outside_serve_mode():
    taskset = {"path": "tasks.jsonl", "reward_fn": "accuracy"}
    with pytest.raises(ValidationError, match=r"explorer\.keep_serving_after_last_step: only mode 'serve'"):
        RunConfig.model_validate({**SERVE, "mode": "both", "buffer": {"taskset": taskset}, **SERVE_ON})


def test_only_the_last_stage_may_keep_serving():
    held_back = RunConfig.model_validate({**SERVE, **SERVE_ON, "stages": [{"buffer": {"total_steps": 2}}]})
    with pytest.raises(ConfigError, match=r"^explorer\.keep_serving_after_last_step: only the last stage"):
        held_back.stage_configs()
    last = {**SERVE, "stages": [SERVE_ON]}
    assert [c.explorer.keep_serving_after_last_step for c in RunConfig.model_validate(last).stage_configs()] == [
        False,
        True,
    ]
