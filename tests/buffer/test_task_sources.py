"""Where task rows come from and how they become tasks: file formats, Hugging Face dataset folders (configs and
splits), row filters, per-row reward and workflow names, prompt templates, and the errors bad input gets."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import grpc
import pytest

from trinity.buffer.confinement import DataRoots
from trinity.buffer.offline import offline_experiences
from trinity.buffer.rows import read_rows
from trinity.buffer.tasksets.mapping import RowMapping, check_rows
from trinity.clients import BufferClient
from trinity.config import OfflineDataConfig, TaskSetConfig
from trinity.runtime.errors import InvalidArgument, PermissionDenied
from trinity.v1 import common_pb2

ROWS = [{"question": f"What is {i} plus one?", "answer": f"n{i + 1}", "level": i % 3} for i in range(6)]


@pytest.fixture(autouse=True)
def without_torch(monkeypatch):
    """Read as the buffer does: its image has no torch, and beside one `datasets` is told to leave it alone."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "TORCH_AVAILABLE", False)


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


def _rows(root: Path, path: Path | str, **keys) -> list[dict]:
    return read_rows(TaskSetConfig(path=str(path), **keys), roots=DataRoots([str(root)]), where="spec.")


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _hub_folder(folder: Path) -> Path:
    """Two configs in subfolders, each with train and test splits, as the Hub lays a dataset out (gsm8k's shape)."""
    for config in ("main", "socratic"):
        for split, rows in (("train", ROWS[:4]), ("test", ROWS[4:])):
            tagged = [{**row, "question": f"{config}: {row['question']}"} for row in rows]
            _parquet(folder / config / f"{split}-00000-of-00001.parquet", tagged)
    card = ["---", "configs:"]
    for config in ("main", "socratic"):
        card += [f"- config_name: {config}", f"  default: {config == 'main'}", "  data_files:"]
        card += [f"  - split: {split}\n    path: {config}/{split}-*" for split in ("train", "test")]
    (folder / "README.md").write_text("\n".join([*card, "---", "# A dataset", ""]))
    return folder


# ---- formats -------------------------------------------------------------------------------------------


def _write(path: Path) -> Path:
    import pyarrow as pa

    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif path.name == "array.json":
        path.write_text(json.dumps(ROWS))
    elif path.name == "lines.json":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif path.suffix == ".csv":
        path.write_text(
            "question,answer,level\n" + "".join(f"{r['question']},{r['answer']},{r['level']}\n" for r in ROWS)
        )
    elif path.suffix == ".parquet":
        _parquet(path, ROWS)
    elif path.suffix == ".arrow":
        table = pa.Table.from_pylist(ROWS)
        with pa.ipc.new_stream(path, table.schema) as writer:  # the layout save_to_disk writes
            writer.write_table(table)
    return path


@pytest.mark.parametrize("name", ["tasks.jsonl", "array.json", "lines.json", "tasks.csv", "tasks.parquet", "t.arrow"])
def test_each_file_format_loads_its_rows(tmp_path, name):
    assert _rows(tmp_path, _write(tmp_path / name)) == ROWS


def test_a_declared_format_overrides_the_suffix(tmp_path):
    path = tmp_path / "tasks.txt"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert _rows(tmp_path, path, format="json") == ROWS
    with pytest.raises(InvalidArgument, match=r"spec\.format: cannot tell the format of 'tasks.txt'"):
        _rows(tmp_path, path)


def test_a_hub_folder_reads_its_split_from_data(tmp_path):
    _parquet(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet", ROWS[:4])
    _parquet(tmp_path / "ds" / "data" / "test-00000-of-00001.parquet", ROWS[4:])
    assert _rows(tmp_path, tmp_path / "ds") == ROWS[:4]
    assert _rows(tmp_path, tmp_path / "ds", split="test") == ROWS[4:]


def test_a_hub_folder_with_configs_reads_the_subset_and_split_asked_for(tmp_path):
    folder = _hub_folder(tmp_path / "gsm")
    rows = _rows(tmp_path, folder, subset="socratic", split="test")
    assert [r["question"] for r in rows] == [f"socratic: {r['question']}" for r in ROWS[4:]]
    assert _rows(tmp_path, folder)[0]["question"].startswith("main: ")  # no subset: the default config


def test_an_unknown_subset_or_split_lists_what_the_folder_has(tmp_path):
    folder = _hub_folder(tmp_path / "gsm")
    with pytest.raises(InvalidArgument, match=r"spec\.subset: .*'nope'.*'main', 'socratic'"):
        _rows(tmp_path, folder, subset="nope")
    with pytest.raises(InvalidArgument, match=r"spec\.split: 'validation' not in .*; splits: train, test"):
        _rows(tmp_path, folder, subset="main", split="validation")


def test_a_subset_of_a_single_file_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match=r"spec\.subset: 'tasks\.jsonl' is one file"):
        _rows(tmp_path, _write(tmp_path / "tasks.jsonl"), subset="main")


def test_a_save_to_disk_directory_reads_its_split(tmp_path):
    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:4]), "test": datasets.Dataset.from_list(ROWS[4:])}
    ).save_to_disk(str(saved))
    assert _rows(tmp_path, saved, split="test") == ROWS[4:]


def test_reading_a_hub_folder_opens_no_network_connection(tmp_path, monkeypatch):
    folder = _hub_folder(tmp_path / "gsm")

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert len(_rows(tmp_path, folder, subset="main")) == 4


def test_offline_data_reads_a_hub_folder_config_through_its_filters(tmp_path):
    folder = _hub_folder(tmp_path / "gsm")
    config = OfflineDataConfig(
        path=str(folder), subset="main", prompt_key="question", response_key="answer",
        filters=[{"key": "level", "op": "eq", "value": 1}],
    )  # fmt: skip
    experiences, skipped = offline_experiences(config, common_pb2.EXPERIENCE_KIND_SFT, DataRoots([str(tmp_path)]))
    assert [(e.prompt_text, e.response_text) for e in experiences] == [("main: What is 1 plus one?", "n2")]
    assert skipped == 0


# ---- data roots -------------------------------------------------------------------------------------------


def test_a_dataset_folder_outside_the_data_roots_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    folder = _hub_folder(outside / "gsm")
    with pytest.raises(PermissionDenied, match="outside the buffer's data roots"):
        _rows(root, folder, subset="main")


def test_a_dataset_card_naming_files_outside_its_folder_is_refused(tmp_path):
    _write(tmp_path / "secret.csv")
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: ../secret.csv\n---\n"
    )
    with pytest.raises(PermissionDenied, match=r"names data files at '\.\./secret\.csv', outside the folder"):
        _rows(tmp_path, folder)


# ---- filters ----------------------------------------------------------------------------------------------

LEVELS = [{"level": level, "text": text} for level, text in ((0, "a"), (1, "bbb"), (2, ""), (3, "dddd"), (None, "e"))]


@pytest.mark.parametrize(
    ("op", "value", "kept"),
    [
        ("eq", 1, [1]),
        ("ne", 1, [0, 2, 3, None]),  # a missing (null) field is not equal to anything
        ("in", [1, 3], [1, 3]),
        ("not_in", [1, 3], [0, 2, None]),
        ("lt", 2, [0, 1]),
        ("le", 2, [0, 1, 2]),
        ("gt", 2, [3]),
        ("ge", 2, [2, 3]),
        ("not_empty", None, [0, 1, 3, None]),  # on `text`, below
        ("min_chars", 3, [1, 3]),
        ("max_chars", 1, [0, 2, None]),
    ],
)
def test_each_filter_op_keeps_the_rows_it_names(tmp_path, op, value, kept):
    path = tmp_path / "levels.jsonl"
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in LEVELS))
    key = "text" if op in ("not_empty", "min_chars", "max_chars") else "level"
    rows = _rows(tmp_path, path, filters=[{"key": key, "op": op, "value": value}])
    assert [r.get("level") for r in rows] == kept


def test_filters_apply_before_the_limit(tmp_path):
    rows = _rows(tmp_path, _write(tmp_path / "t.jsonl"), filters=[{"key": "level", "op": "eq", "value": 2}], limit=1)
    assert rows == [ROWS[2]]


def test_a_filter_on_a_column_no_row_has_lists_the_columns(tmp_path):
    with pytest.raises(InvalidArgument, match=r"spec\.filters\[0\]\.key: 'levl' is in no row; .*answer, level, q"):
        _rows(tmp_path, _write(tmp_path / "t.jsonl"), filters=[{"key": "levl", "op": "eq", "value": 1}])


def test_a_filter_comparing_text_with_a_number_names_the_row(tmp_path):
    with pytest.raises(InvalidArgument, match=r"spec\.filters\[0\]: row 0: 'answer' is 'n1'"):
        _rows(tmp_path, _write(tmp_path / "t.jsonl"), filters=[{"key": "answer", "op": "gt", "value": 1}])


# ---- column mapping and templates ---------------------------------------------------------------------------


def _fields(rows: list[dict], **keys):
    config = TaskSetConfig(path="unused.jsonl", prompt_key="question", **keys)
    mapping = RowMapping(config)
    check_rows(rows, mapping)
    return [mapping.fields(row, i) for i, row in enumerate(rows)]


def test_a_raw_template_joins_system_prompt_examples_and_the_question(tmp_path):
    template = {
        "format": "raw",
        "system_prompt": "Answer briefly.",
        "few_shot": [{"prompt": "Q: 1+1?", "answer": "A: 2"}],
        "prompt": "Q: {question} (level {level})\nA:",
    }
    fields = _fields(ROWS[:1], template=template)[0]
    assert fields.prompt == "Answer briefly.\n\nQ: 1+1?\nA: 2\n\nQ: What is 0 plus one? (level 0)\nA:"
    assert fields.messages == ()


def test_a_chat_template_over_a_chat_prompt_puts_the_row_messages_last():
    rows = [{"question": [{"role": "user", "content": "hi"}]}]
    fields = _fields(rows, template={"system_prompt": "Be kind.", "few_shot": [{"prompt": "yo", "answer": "hey"}]})[0]
    assert fields.messages == (("system", "Be kind."), ("user", "yo"), ("assistant", "hey"), ("user", "hi"))


def test_a_template_naming_a_missing_column_lists_the_columns_found():
    with pytest.raises(InvalidArgument, match=r"template\.prompt: row 0 has no 'qestion'; the row has: answer, level"):
        _fields(ROWS, template={"prompt": "{qestion}"})


def test_a_raw_template_refuses_a_chat_prompt_it_cannot_flatten():
    with pytest.raises(InvalidArgument, match=r"template\.prompt: row 0: 'question' is a chat"):
        _fields([{"question": [{"role": "user", "content": "hi"}]}], template={"format": "raw"})


def test_a_per_row_reward_fn_must_be_a_registered_reward():
    rows = [{"question": "q", "scorer": "accuracyy"}]
    with pytest.raises(InvalidArgument, match=r"reward_fn_key: row 0: 'scorer' is 'accuracyy'.*unknown"):
        _fields(rows, reward_fn_key="scorer")


def test_a_per_row_key_no_row_has_lists_the_columns():
    with pytest.raises(InvalidArgument, match="workflow_key: 'flow' is in no row; the rows have: answer, level"):
        _fields(ROWS, workflow_key="flow")


# ---- through the buffer -------------------------------------------------------------------------------------


def test_tasks_take_reward_and_workflow_from_their_row_falling_back_when_empty(client, unique, tmp_path):
    rows = [
        {"question": "a", "scorer": "format", "flow": "math"},
        {"question": "b", "scorer": "", "flow": None},
        {"question": "c"},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = TaskSetConfig(
        name=unique, path=str(path), prompt_key="question", reward_fn="accuracy",
        reward_fn_key="scorer", workflow_key="flow",
    )  # fmt: skip
    client.create_taskset(config)
    tasks = client.lease_tasks(unique, "e", 3).tasks
    assert [(t.reward_fn, t.workflow) for t in tasks] == [("format", "math"), ("accuracy", ""), ("accuracy", "")]
    assert tasks[0].payload["scorer"] == "format"  # the whole row is the payload


def test_a_chat_template_and_filters_travel_to_the_buffer(client, unique, tmp_path):
    system = "Think step by step. " * 100  # longer than a name: a template's texts are bounded as texts
    config = TaskSetConfig(
        name=unique, path=str(_write(tmp_path / "t.parquet")), answer_key="answer",
        filters=[{"key": "level", "op": "in", "value": [1, 2]}],
        template={"system_prompt": system, "few_shot": [{"prompt": "2+2?", "answer": "4"}], "prompt": "Q: {question}"},
    )  # fmt: skip
    info = client.create_taskset(config)
    assert info.size == 4
    task = client.lease_tasks(unique, "e", 1).tasks[0]
    assert [(m.role, m.content) for m in task.messages] == [
        ("system", system), ("user", "2+2?"), ("assistant", "4"), ("user", "Q: What is 1 plus one?"),
    ]  # fmt: skip
    assert (task.prompt, task.answer) == ("", "n2")
    assert client.create_taskset(config).size == 4  # the same spec again: the stored one, read back, is equal


def test_a_missing_template_column_is_invalid_argument(client, unique, tmp_path):
    config = TaskSetConfig(name=unique, path=str(_write(tmp_path / "t.jsonl")), template={"prompt": "{qestion}"})
    with pytest.raises(grpc.RpcError) as info:
        client.create_taskset(config)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "template.prompt: row 0 has no 'qestion'; the row has: answer, level, question" in info.value.details()
