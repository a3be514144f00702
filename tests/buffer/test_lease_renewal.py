"""RenewTaskLeases through a real Buffer process: a renewed lease outlives its first deadline; lost ones are named."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from trinity.clients import BufferClient
from trinity.config import TaskSetConfig
from trinity.v1 import buffer_pb2

ROWS = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(4)]


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


@pytest.fixture
def taskset(client: BufferClient, unique: str, tmp_path: Path) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    client.create_taskset(TaskSetConfig(name=unique, path=str(path), epochs=2))
    return unique


SHORT = 0.3  # seconds: leases meant to expire
RENEWABLE = 2.0  # seconds: leases renewed at once, with time to spare on a busy machine


def _sleep_past(deadline_ms: int) -> None:
    time.sleep(max(0.0, deadline_ms / 1000 - time.time()) + 0.1)


def test_a_renewed_lease_is_not_handed_out_after_its_first_deadline(client, taskset):
    task = client.lease_tasks(taskset, "explorer-a", 1, lease_seconds=RENEWABLE).tasks[0]
    reply = client.renew_task_leases(taskset, "explorer-a", [task.lease_id], lease_seconds=60)
    assert (list(reply.renewed), list(reply.lost)) == ([task.lease_id], [])
    assert reply.lease_deadline_ms > task.lease_deadline_ms
    _sleep_past(task.lease_deadline_ms)
    others = client.lease_tasks(taskset, "explorer-b", 8).tasks
    assert task.lease_id not in [t.lease_id for t in others]


def test_a_lease_re_leased_elsewhere_is_reported_lost(client, taskset):
    task = client.lease_tasks(taskset, "explorer-a", 1, lease_seconds=SHORT).tasks[0]
    _sleep_past(task.lease_deadline_ms)
    taken = client.lease_tasks(taskset, "explorer-b", 1).tasks[0]
    assert taken.lease_id == task.lease_id  # expired leases go out first
    reply = client.renew_task_leases(taskset, "explorer-a", [task.lease_id])
    assert (list(reply.renewed), list(reply.lost)) == ([], [task.lease_id])


def test_an_expired_lease_nobody_took_is_still_renewed(client, taskset):
    task = client.lease_tasks(taskset, "explorer-a", 1, lease_seconds=SHORT).tasks[0]
    _sleep_past(task.lease_deadline_ms)
    reply = client.renew_task_leases(taskset, "explorer-a", [task.lease_id], lease_seconds=60)
    assert list(reply.renewed) == [task.lease_id]
    assert task.lease_id not in [t.lease_id for t in client.lease_tasks(taskset, "explorer-b", 8).tasks]


def test_a_completed_lease_is_reported_lost(client, taskset):
    task = client.lease_tasks(taskset, "explorer-a", 1).tasks[0]
    client.complete_tasks(taskset, "explorer-a", [buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id)])
    assert list(client.renew_task_leases(taskset, "explorer-a", [task.lease_id]).lost) == [task.lease_id]


def test_a_failed_task_is_completed_for_good_and_never_scored(client, taskset):
    task = client.lease_tasks(taskset, "explorer-a", 1, lease_seconds=SHORT).tasks[0]
    failed = buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id, pass_rate=1.0, failed=True)
    assert client.complete_tasks(taskset, "explorer-a", [failed]).completed == 1
    _sleep_past(task.lease_deadline_ms)
    rest = client.lease_tasks(taskset, "explorer-b", 8).tasks  # the rest of both epochs
    assert task.lease_id not in [t.lease_id for t in rest]
    assert [t.pass_rate for t in rest if t.index == task.index] == [-1.0]  # its epoch-2 copy: still unscored
    info = client.taskset(taskset)
    assert (info.completed, info.failed) == (1, 1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"taskset": ""}, "taskset"),
        ({"consumer": ""}, "consumer"),
        ({"lease_ids": []}, "lease_ids"),
        ({"lease_ids": ["0", ""]}, "lease_ids[1]"),
        ({"lease_seconds": -1.0}, "lease_seconds"),
        ({"lease_seconds": float("nan")}, "lease_seconds"),
    ],
)
def test_bad_renewal_requests_name_the_field(client, taskset, change, field):
    request = {"taskset": taskset, "consumer": "explorer-a", "lease_ids": ["0"], "lease_seconds": 0.0, **change}
    with pytest.raises(grpc.RpcError) as err:
        client.renew_task_leases(**request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
