"""Several train task sets in one run (`buffer.tasksets`, `buffer.mixing`): what the config accepts and refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trinity.config import ConfigError, load_run_config, parse_run_config


def _config(buffer: dict) -> str:
    return yaml.safe_dump({"model": {"path": "m"}, "buffer": buffer})


def _sets(*names: str, **extra) -> list[dict]:
    return [{"name": n, "path": f"{n}.jsonl", **extra} for n in names]


def test_a_single_taskset_is_a_mixture_of_one():
    config = parse_run_config(_config({"taskset": {"path": "t.jsonl"}}))
    assert [t.name for t in config.buffer.train_tasksets] == ["train"]


def test_tasksets_are_the_train_task_sets_in_order():
    config = parse_run_config(_config({"tasksets": _sets("math", "code"), "mixing": {"strategy": "proportional"}}))
    assert [t.name for t in config.buffer.train_tasksets] == ["math", "code"]
    assert config.buffer.mixing.strategy == "proportional"


@pytest.mark.parametrize(
    ("buffer", "message"),
    [
        ({"taskset": {"path": "t"}, "tasksets": _sets("a")}, "buffer: tasksets: set either taskset"),
        ({"tasksets": _sets("a", "b", "a")}, "buffer: tasksets[2]: task set 'a' is listed twice (also tasksets[0])"),
        ({"tasksets": [*_sets("a"), *_sets("b", weight=-1)]}, "buffer.tasksets.1.weight: Input should be greater"),
        ({"tasksets": _sets("a", "b", weight=0)}, "buffer: tasksets: every weight is 0"),
        (
            {"tasksets": _sets("a", "b", weight=1), "mixing": {"strategy": "temperature"}},
            "buffer: tasksets[0].weight: mixing.strategy 'temperature' shares by size and reads no weights",
        ),
        ({"tasksets": _sets("a", "b"), "mixing": {"temperature": 0}}, "buffer.mixing.temperature"),
        (
            {"taskset": {"path": "t"}, "eval_tasksets": _sets("e", weight=1)},
            "buffer: eval_tasksets[0].weight: only train task sets are mixed",
        ),
        ({"tasksets": []}, "buffer.taskset: required in mode 'both'"),
    ],
    ids=["both", "duplicate", "negative", "all-zero", "weight-by-size", "temperature", "eval-weight", "none"],
)
def test_a_wrong_mixture_is_refused_naming_the_key(buffer, message):
    with pytest.raises(ConfigError) as err:
        parse_run_config(_config(buffer))
    assert message in str(err.value)


def test_task_set_paths_are_relative_to_the_config_file_in_stages_too(tmp_path: Path):
    text = _config({"tasksets": _sets("a", "b")}) + yaml.safe_dump({"stages": [{"buffer": {"tasksets": _sets("c")}}]})
    (tmp_path / "run.yaml").write_text(text)
    config = load_run_config(tmp_path / "run.yaml")
    assert [t.path for t in config.buffer.tasksets] == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert [t.path for t in config.stage_configs()[1].buffer.tasksets] == [str(tmp_path / "c.jsonl")]


def test_a_stage_switches_from_one_task_set_to_several_by_unsetting_the_one():
    text = _config({"taskset": {"path": "t"}}) + yaml.safe_dump(
        {"stages": [{"buffer": {"taskset": None, "tasksets": _sets("a", "b")}}]}
    )
    first, second = parse_run_config(text).stage_configs()
    assert [t.name for t in first.buffer.train_tasksets] == ["train"]
    assert [t.name for t in second.buffer.train_tasksets] == ["a", "b"]
