"""Task sets through a real Buffer process: formats, key mapping, selectors, epochs, leases, curriculum."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from trinity.clients import BufferClient
from trinity.config import TaskSetConfig
from trinity.v1 import buffer_pb2

ROWS = [{"question": f"What is {i}+1?", "solution": str(i + 1), "level": i % 3} for i in range(6)]


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _config(name: str, path: Path, **kw) -> TaskSetConfig:
    return TaskSetConfig(name=name, path=str(path), prompt_key="question", answer_key="solution", **kw)


def _drain(client: BufferClient, name: str, batch: int = 4) -> list[int]:
    """Lease everything and complete it; return row indices in hand-out order."""
    order: list[int] = []
    while True:
        reply = client.lease_tasks(name, "explorer-1", batch)
        if not reply.tasks:
            assert reply.exhausted
            return order
        order += [t.index for t in reply.tasks]
        results = [buffer_pb2.TaskResult(lease_id=t.lease_id, task_id=t.id, pass_rate=-1) for t in reply.tasks]
        client.complete_tasks(name, "explorer-1", results)


def test_tasks_carry_mapped_fields_and_the_whole_row(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl, reward_fn="accuracy"))
    task = client.lease_tasks(unique, "e", 1).tasks[0]
    assert (task.id, task.prompt, task.answer) == (f"{unique}/0", "What is 0+1?", "1")
    assert (task.reward_fn, task.epoch) == ("accuracy", 0)
    assert task.payload["level"] == 0
    assert task.pass_rate == -1


def test_parquet_and_datasets_directories_load_like_jsonl(client, unique, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(saved))
    for suffix, path in (("pq", parquet), ("ds", saved)):
        info = client.create_taskset(_config(unique + suffix, path))
        assert info.size == len(ROWS)
        assert client.lease_tasks(unique + suffix, "e", 1).tasks[0].prompt == "What is 0+1?"


def test_sequential_selector_runs_every_epoch_in_order(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl, epochs=2))
    assert _drain(client, unique) == [0, 1, 2, 3, 4, 5] * 2
    info = client.taskset(unique)
    assert (info.total_tasks, info.completed, info.exhausted) == (12, 12, True)


def test_shuffle_selector_gives_each_row_once_per_epoch_in_a_new_order(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl, epochs=2, selector="shuffle", seed=7))
    order = _drain(client, unique)
    first, second = order[:6], order[6:]
    assert sorted(first) == sorted(second) == list(range(6))
    assert first != second and first != list(range(6))


def test_random_selector_samples_with_replacement_deterministically(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl, epochs=3, selector="random", seed=1))
    order = _drain(client, unique)
    assert len(order) == 18 and set(order) <= set(range(6))
    assert len(set(order)) < 18  # with replacement: some rows repeat
    client.create_taskset(_config(unique, jsonl, epochs=3, selector="random", seed=1), replace=True)
    assert _drain(client, unique) == order  # same seed, same order


def test_a_lease_that_expires_is_handed_out_again(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl, lease_seconds=0.3))
    lost = client.lease_tasks(unique, "crashed-explorer", 2).tasks
    assert [t.index for t in lost] == [0, 1]
    time.sleep(0.4)
    again = client.lease_tasks(unique, "healthy-explorer", 3).tasks
    assert [t.index for t in again] == [0, 1, 2]  # expired leases come first, then new tasks
    assert not client.lease_tasks(unique, "e", 100).exhausted  # leased, not yet completed


def test_release_returns_a_dead_consumers_tasks_at_once(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl))
    client.lease_tasks(unique, "dead", 2)
    client.lease_tasks(unique, "alive", 1)
    assert client.release_tasks("dead", unique) == 2
    assert [t.index for t in client.lease_tasks(unique, "alive", 2).tasks] == [0, 1]


def test_completion_of_an_unknown_lease_is_reported_not_counted(client, unique, jsonl):
    client.create_taskset(_config(unique, jsonl))
    task = client.lease_tasks(unique, "e", 1).tasks[0]
    result = buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id, pass_rate=1.0)
    assert client.complete_tasks(unique, "e", [result]).completed == 1
    reply = client.complete_tasks(unique, "e", [result])
    assert (reply.completed, reply.unknown) == (0, 1)
    assert client.taskset(unique).completed == 1


def test_difficulty_curriculum_prefers_tasks_near_the_target_pass_rate(client, unique, jsonl):
    client.create_taskset(
        _config(unique, jsonl, epochs=2, selector="difficulty", target_pass_rate=0.5, curriculum_temperature=0)
    )
    # Epoch 0: nothing scored yet, so rows go out in order; report how hard each one was.
    first = client.lease_tasks(unique, "e", 6).tasks
    assert [t.index for t in first] == list(range(6))
    rates = {0: 1.0, 1: 0.0, 2: 0.5, 3: 0.9, 4: 0.4, 5: 0.0}
    client.complete_tasks(
        unique,
        "e",
        [buffer_pb2.TaskResult(lease_id=t.lease_id, task_id=t.id, pass_rate=rates[t.index]) for t in first],
    )
    # Epoch 1: closest to 0.5 first (2: 0.0 away, 4: 0.1, 3: 0.4, then 0/1/5 at 0.5 by row order).
    second = client.lease_tasks(unique, "e", 6).tasks
    assert [t.index for t in second] == [2, 4, 3, 0, 1, 5]
    assert second[0].pass_rate == 0.5


def test_bad_taskset_requests_name_the_field(client, unique, jsonl, tmp_path):
    cases = [
        (_config(unique, tmp_path / "missing.jsonl"), grpc.StatusCode.NOT_FOUND, "spec.path"),
        (TaskSetConfig(name=unique, path=str(jsonl)), grpc.StatusCode.INVALID_ARGUMENT, "prompt_key"),
    ]
    for config, code, fragment in cases:
        with pytest.raises(grpc.RpcError) as info:
            client.create_taskset(config)
        assert info.value.code() == code
        assert fragment in info.value.details(), info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        client.lease_tasks("no-such-taskset", "e", 1)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    client.create_taskset(_config(unique, jsonl))
    with pytest.raises(grpc.RpcError) as info:
        client.lease_tasks(unique, "e", 0)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "batch_size" in info.value.details()


def test_malformed_jsonl_reports_the_line(client, unique, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "ok"}\n{not json}\n')
    with pytest.raises(grpc.RpcError) as info:
        client.create_taskset(_config(unique, path))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bad.jsonl:2" in info.value.details()
