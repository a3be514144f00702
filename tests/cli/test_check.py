"""`trinity check --config FILE` validates what `trinity run` would and prints the run it resolves to, starting
nothing: exit 0, or 2 naming the field."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cli.test_preflight import BAD_INPUT, _config
from tests.cli.test_preflight import files as files  # the fixture, shared
from trinity.cli.main import main
from trinity.config import ConfigError, parse_run_config
from trinity.config.resolved import resolved_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def trinity(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """The `trinity` command line, in this process (it starts nothing)."""

    def run(*args: str) -> Done:
        code = main(list(args))
        out = capsys.readouterr()
        return Done(code, out.out, out.err)

    return run


def _check(trinity: Callable[..., Done], config: Path, *flags: str) -> dict:
    done = trinity("check", "--config", str(config), *flags)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("valid (1 stage)")
    return yaml.safe_load(done.stdout)


def test_check_prints_the_quickstart_as_it_will_run(trinity: Callable[..., Done]) -> None:
    resolved = _check(trinity, EXAMPLES / "quickstart" / "config.yaml")
    algorithm = resolved["algorithm"]
    assert algorithm["preset"] == "grpo" and algorithm["group_size"] == 8 and algorithm["train_batch_size"] == 64
    assert algorithm["functions"]["policy_loss"] == {
        "name": "ppo", "clip_range": 0.2, "clip_range_low": None, "clip_range_high": None, "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean", "norm_constant": None,
    }  # fmt: skip
    assert algorithm["reference_model"] is False  # kl_coef 0: no reference pass
    assert resolved["config"]["trainer"]["mini_batch_size"] == 32  # defaults and settings, every one written out


def test_check_shows_what_a_preset_applies(trinity: Callable[..., Done], files: dict[str, Path]) -> None:
    resolved = _check(trinity, _config(files, **{"algorithm.algorithm_type": "dapo", "model.max_response_tokens": 20}))
    algorithm = resolved["algorithm"]
    assert algorithm["group_size"] == 16  # the preset's, as the config sets none
    assert algorithm["functions"]["policy_loss"]["clip_range_high"] == 0.28
    assert algorithm["stream_operators"] == [
        {"name": "overlong_reward_penalty", "params": {"max_response_length": 20, "cache_length": 4}, "by": "preset"},
        {"name": "reward_std_filter", "params": {}, "by": "preset"},
    ]


def test_check_names_a_mistyped_override(trinity: Callable[..., Done], files: dict[str, Path]) -> None:
    done = trinity("check", "--config", str(_config(files, **{"algorithm.policy_loss": {"clip_rang": 0.3}})))
    assert done.returncode == BAD_INPUT
    assert "algorithm.policy_loss: policy loss 'ppo' has no hyperparameter 'clip_rang'; accepted: clip_range," in (
        done.stderr
    )


def test_check_refuses_a_preset_the_workflow_cannot_feed(trinity: Callable[..., Done], files: dict[str, Path]) -> None:
    done = trinity("check", "--config", str(_config(files, **{"algorithm.algorithm_type": "gigpo"})))
    assert done.returncode == BAD_INPUT
    assert "algorithm.algorithm_type: 'gigpo' needs per-row episode_ids" in done.stderr
    assert "step_group_ids (from Experience.state_key" in done.stderr and "workflow 'math'" in done.stderr


def test_check_looks_for_the_files_unless_remote(trinity: Callable[..., Done], files: dict[str, Path]) -> None:
    config = _config(files, **{"buffer.taskset.path": "/nowhere/tasks.jsonl"})
    done = trinity("check", "--config", str(config))
    assert done.returncode == BAD_INPUT and "buffer.taskset.path: no such file: /nowhere/tasks.jsonl" in done.stderr
    assert _check(trinity, config, "--remote")["config"]["buffer"]["taskset"]["path"] == "/nowhere/tasks.jsonl"


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"algorithm_type": "grpo", "policy_loss": {"clip_range": "wide"}}, "clip_range: 'ppo' takes a float"),
        ({"algorithm_type": "grpo", "value_loss": {"cliprange_value": 0.2}}, "'grpo' has no value loss to override"),
        ({"algorithm_type": "grpo", "advantage": {"std_normalize": 1}}, "'grpo' takes a bool (default True), got 1"),
        ({"algorithm_type": "on_policy_distill"}, "algorithm.teacher_model: 'on_policy_distill' distills"),
    ],
)
def test_a_bad_algorithm_section_is_refused_when_parsed_naming_the_field(algorithm: dict, message: str) -> None:
    text = yaml.safe_dump({"model": {"path": "m"}, "algorithm": algorithm, "buffer": {"taskset": {"path": "t"}}})
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_run_config(text)


def test_a_later_stage_gets_its_own_presets_group_size() -> None:
    text = yaml.safe_dump(
        {
            "mode": "both",
            "model": {"path": "m"},
            "buffer": {"taskset": {"path": "t"}},
            "stages": [{"algorithm": {"algorithm_type": "dapo"}}],
        }
    )
    first, second = resolved_run(parse_run_config(text))
    assert (first["algorithm"]["group_size"], second["algorithm"]["group_size"]) == (2, 16)
