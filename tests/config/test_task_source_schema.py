"""What the schema refuses of a task set's row filters and prompt template, before anything reads a file."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from trinity.cli.main import main
from trinity.config import TaskSetConfig


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"key": "level", "op": "in", "value": 1}, "op 'in' needs a list of values"),
        ({"key": "level", "op": "not_in", "value": []}, "op 'not_in' needs a list of values"),
        ({"key": "level", "op": "eq"}, "op 'eq' needs one value"),
        ({"key": "level", "op": "lt", "value": [1]}, "op 'lt' needs one value"),
        ({"key": "level", "op": "gt", "value": True}, "op 'gt' compares numbers or text"),
        ({"key": "answer", "op": "not_empty", "value": "x"}, "op 'not_empty' takes no value"),
        ({"key": "prompt", "op": "max_chars", "value": 1.5}, "op 'max_chars' needs a whole number"),
        ({"key": "prompt", "op": "min_chars", "value": -1}, "op 'min_chars' needs a whole number"),
        ({"key": "level", "op": "like", "value": 1}, "Input should be 'eq', 'ne', 'in'"),
    ],
)
def test_a_filter_value_must_fit_its_op(rule, message):
    with pytest.raises(ValidationError, match=message):
        TaskSetConfig(path="t.jsonl", filters=[rule])


def test_filter_numbers_that_crossed_the_wire_as_doubles_read_back_as_ints():
    config = TaskSetConfig(path="t.jsonl", filters=[{"key": "level", "op": "in", "value": [1.0, 2.5]}])
    assert config.filters[0].value == (1, 2.5) and isinstance(config.filters[0].value[0], int)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("Q: {}", "names no column"),
        ("Q: {0}", "names no column"),
        ("Q: {question.text}", "attribute access is not supported"),
        ("Q: {question", "expected '}' before end of string"),
        ('JSON: {"a": 1}', "names no column"),  # a literal brace is written {{
    ],
)
def test_a_template_prompt_that_rows_cannot_fill_is_refused(prompt, message):
    with pytest.raises(ValidationError, match=message):
        TaskSetConfig(path="t.jsonl", template={"prompt": prompt})


def test_a_template_prompt_may_index_nested_columns_and_escape_braces():
    prompt = "{{level {meta[level]}}} Q: {question!s:>4}"
    assert TaskSetConfig(path="t.jsonl", template={"prompt": prompt}).template.prompt == prompt


def test_trinity_check_exits_2_naming_a_bad_filter_and_template(tmp_path, capsys):
    taskset = {"path": "t.jsonl", "filters": [{"key": "level", "op": "in", "value": 1}], "template": {"prompt": "{}"}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": "smollm2"}, "buffer": {"taskset": taskset}}))
    assert main(["check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "buffer.taskset.filters.0: op 'in' needs a list of values" in err
    assert "buffer.taskset.template.prompt: {} names no column" in err
