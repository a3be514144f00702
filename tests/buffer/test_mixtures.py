"""Mixtures of task sets through a real Buffer process: shares per strategy, running dry, routing, bad input."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import grpc
import pytest

from trinity.clients import BufferClient
from trinity.config import MixingConfig, MixtureConfig, MixtureMember, TaskSetConfig
from trinity.v1 import buffer_pb2

DRAWS = 2000


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


def _taskset(client: BufferClient, tmp_path: Path, name: str, rows: int, epochs: int = 1, **kw) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{name} {i}", "answer": str(i)}) + "\n" for i in range(rows)))
    client.create_taskset(TaskSetConfig(name=name, path=str(path), epochs=epochs, **kw))
    return name


def _mixture(name: str, members: dict[str, float | None], **mixing) -> MixtureConfig:
    return MixtureConfig(
        name=name,
        members=tuple(MixtureMember(taskset=t, weight=w) for t, w in members.items()),
        mixing=MixingConfig(**mixing),
    )


def _lease_all(client: BufferClient, name: str, count: int, batch: int = 100, consumer: str = "e") -> list[str]:
    """The task set of each of `count` tasks leased from `name`, in hand-out order."""
    drawn: list[str] = []
    while len(drawn) < count:
        tasks = client.lease_tasks(name, consumer, min(batch, count - len(drawn))).tasks
        assert tasks, "the mixture ran dry before the draws were done"
        drawn += [t.taskset for t in tasks]
    return drawn


def _complete(client: BufferClient, tasks, pass_rate: float = -1.0) -> None:
    for task in tasks:
        result = buffer_pb2.TaskResult(lease_id=task.lease_id, task_id=task.id, pass_rate=pass_rate, samples=1)
        client.complete_tasks(task.taskset, "e", [result])


# (rows, epochs) per member: sizes (rows x epochs) 4000, 12000, 4000, none running dry within DRAWS.
SIZES = {"a": (10, 400), "b": (20, 600), "c": (40, 100)}


@pytest.mark.parametrize(
    ("mixing", "weights", "expected"),
    [
        ({"strategy": "fixed"}, {"a": 1.0, "b": 2.0, "c": 5.0}, {"a": 1 / 8, "b": 2 / 8, "c": 5 / 8}),
        ({"strategy": "proportional"}, {}, {"a": 4 / 20, "b": 12 / 20, "c": 4 / 20}),
        (
            {"strategy": "temperature", "temperature": 2.0},
            {},
            {
                k: math.sqrt(n) / (2 * math.sqrt(4000) + math.sqrt(12000))
                for k, n in (("a", 4000), ("b", 12000), ("c", 4000))
            },
        ),
    ],
    ids=["fixed", "proportional", "temperature"],
)
def test_each_strategy_mixes_within_three_standard_deviations_over_2000_draws(
    client, unique, tmp_path, mixing, weights, expected
):
    members = {
        _taskset(client, tmp_path, f"{unique}-{k}", rows, epochs): weights.get(k) for k, (rows, epochs) in SIZES.items()
    }
    info = client.create_mixture(_mixture(f"{unique}-mix", members, seed=7, **mixing))
    assert list(info.shares) == pytest.approx([expected[k] for k in SIZES])
    counts = Counter(_lease_all(client, f"{unique}-mix", DRAWS))
    for key in SIZES:
        p, n = expected[key], counts[f"{unique}-{key}"]
        assert abs(n - DRAWS * p) <= 3 * math.sqrt(DRAWS * p * (1 - p)), (key, n, DRAWS * p)
    assert client.mixture(f"{unique}-mix").draws == DRAWS


def test_a_member_with_weight_0_is_never_drawn_nor_waited_for(client, unique, tmp_path):
    none = _taskset(client, tmp_path, f"{unique}-none", 5)
    some = _taskset(client, tmp_path, f"{unique}-some", 5)
    client.create_mixture(_mixture(f"{unique}-mix", {none: 0.0, some: 1.0}))
    reply = client.lease_tasks(f"{unique}-mix", "e", 10)
    assert {t.taskset for t in reply.tasks} == {some} and len(reply.tasks) == 5
    _complete(client, reply.tasks)
    assert client.lease_tasks(f"{unique}-mix", "e", 10).exhausted


def test_a_drained_member_leaves_the_draws_to_the_others_and_all_drained_is_exhausted(client, unique, tmp_path):
    small = _taskset(client, tmp_path, f"{unique}-small", 3)
    large = _taskset(client, tmp_path, f"{unique}-large", 50)
    mixture = f"{unique}-mix"
    client.create_mixture(_mixture(mixture, {small: 9.0, large: 1.0}))
    batches = []
    while tasks := client.lease_tasks(mixture, "e", 10).tasks:
        batches.append(list(tasks))
    # Every batch is full until the last: the small set's 90% went to the large one once it had nothing left.
    assert [len(b) for b in batches] == [10, 10, 10, 10, 10, 3]
    assert Counter(t.taskset for b in batches for t in b) == {small: 3, large: 50}
    reply = client.lease_tasks(mixture, "e", 10)
    assert (list(reply.tasks), reply.exhausted) == ([], False)  # leased, not completed: they may come back
    _complete(client, [t for b in batches for t in b])
    reply = client.lease_tasks(mixture, "e", 10)
    assert (list(reply.tasks), reply.exhausted) == ([], True)
    assert client.mixture(mixture).exhausted


def test_released_leases_of_a_drained_member_come_back_through_the_mixture(client, unique, tmp_path):
    small = _taskset(client, tmp_path, f"{unique}-small", 2)
    large = _taskset(client, tmp_path, f"{unique}-large", 100)
    mixture = f"{unique}-mix"
    client.create_mixture(_mixture(mixture, {small: 1.0, large: 1.0}))
    first = _lease_all(client, mixture, 20, batch=10, consumer="dead")
    assert first.count(small) == 2
    assert client.release_tasks("dead", mixture) == 20  # a mixture's release is every member's
    again = [t for t in client.lease_tasks(mixture, "alive", 40).tasks if t.taskset == small]
    assert len(again) == 2 and {t.epoch for t in again} == {0}


def test_tasks_are_completed_and_renewed_at_their_member_which_keeps_its_curriculum(client, unique, tmp_path):
    hard = _taskset(client, tmp_path, f"{unique}-hard", 2, epochs=2, selector="difficulty")
    easy = _taskset(client, tmp_path, f"{unique}-easy", 4)
    mixture = f"{unique}-mix"
    client.create_mixture(_mixture(mixture, {hard: 1.0, easy: 1.0}))
    tasks = list(client.lease_tasks(mixture, "e", 2).tasks)
    for task in tasks:
        assert task.id.startswith(task.taskset + "/")
        renewed = client.renew_task_leases(task.taskset, "e", [task.lease_id], 30)
        assert list(renewed.renewed) == [task.lease_id]
    with pytest.raises(grpc.RpcError) as err:
        client.complete_tasks(mixture, "e", [buffer_pb2.TaskResult(lease_id=tasks[0].lease_id, task_id=tasks[0].id)])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Task.taskset" in err.value.details()
    seen = []
    while tasks:  # one at a time from here: each completion is recorded before the next lease
        _complete(client, tasks, pass_rate=1.0)
        seen += tasks
        tasks = list(client.lease_tasks(mixture, "e", 1).tasks)
    assert (client.taskset(hard).completed, client.taskset(easy).completed) == (4, 4)
    # The difficulty member recorded its first epoch's pass rates: its second epoch's tasks carry them.
    second = [t for t in seen if t.taskset == hard and t.epoch == 1]
    assert len(second) == 2 and all(t.pass_rate == 1.0 for t in second)


def test_the_draws_follow_one_sequence_whoever_leases(client, unique, tmp_path):
    def members(tag: str) -> dict[str, float | None]:
        return {_taskset(client, tmp_path, f"{unique}-{tag}{k}", 50): w for k, w in (("x", 1.0), ("y", 3.0))}

    client.create_mixture(_mixture(f"{unique}-one", members("one"), seed=3))
    client.create_mixture(_mixture(f"{unique}-two", members("two"), seed=3))
    alone = _lease_all(client, f"{unique}-one", 60, batch=10, consumer="a")
    shared = []
    for i in range(12):  # two consumers taking turns, five tasks each
        shared += [t.taskset for t in client.lease_tasks(f"{unique}-two", f"c{i % 2}", 5).tasks]
    assert [s.removeprefix(f"{unique}-one") for s in alone] == [s.removeprefix(f"{unique}-two") for s in shared]
    assert len(set(alone)) == 2


def test_creating_the_same_mixture_again_keeps_its_draws_and_a_different_one_is_refused(client, unique, tmp_path):
    a, b = _taskset(client, tmp_path, f"{unique}-a", 20), _taskset(client, tmp_path, f"{unique}-b", 20)
    config = _mixture(f"{unique}-mix", {a: 1.0, b: 1.0})
    client.create_mixture(config)
    _lease_all(client, config.name, 5)
    assert client.create_mixture(config).draws == 5
    with pytest.raises(grpc.RpcError) as err:
        client.create_mixture(_mixture(config.name, {a: 1.0, b: 2.0}))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert client.create_mixture(_mixture(config.name, {a: 1.0, b: 2.0}), replace=True).draws == 0


def _spec(name: str, members: list[tuple[str, float | None]], strategy: str = "") -> buffer_pb2.MixtureSpec:
    spec = buffer_pb2.MixtureSpec(name=name, mixing=buffer_pb2.MixingSpec(strategy=strategy))
    for taskset, weight in members:
        member = spec.members.add(taskset=taskset)
        if weight is not None:
            member.weight = weight
    return spec


@pytest.mark.parametrize(
    ("members", "strategy", "message"),
    [
        ([("a", 1.0), ("missing", 1.0)], "", "spec.members[1].taskset: no task set"),
        ([("a", -1.0), ("b", 1.0)], "", "spec.members.0.weight: Input should be greater than or equal to 0"),
        ([("a", 0.0), ("b", 0.0)], "", "every weight is 0"),
        ([("a", 1.0), ("a", 2.0)], "", "listed twice"),
        ([("a", 1.0), ("b", None)], "proportional", "members[0].weight: mixing.strategy 'proportional'"),
        ([], "", "spec.members"),
        ([("a", None)], "uniform", "spec.mixing.strategy"),
    ],
    ids=["unknown-member", "negative-weight", "all-zero", "duplicate", "weight-by-size", "no-members", "strategy"],
)
def test_a_bad_mixture_is_invalid_argument_naming_the_field(client, unique, tmp_path, members, strategy, message):
    names = {"a": _taskset(client, tmp_path, f"{unique}-a", 2), "b": _taskset(client, tmp_path, f"{unique}-b", 2)}
    spec = _spec(f"{unique}-mix", [(names.get(t, f"{unique}-{t}"), w) for t, w in members], strategy)
    with pytest.raises(grpc.RpcError) as err:
        client._call("CreateMixture", buffer_pb2.CreateMixtureRequest(spec=spec))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_mixture_and_task_set_names_never_clash_and_a_mixture_is_no_member(client, unique, tmp_path):
    a = _taskset(client, tmp_path, f"{unique}-a", 2)
    client.create_mixture(_mixture(f"{unique}-mix", {a: None}))
    for request, field in (
        (lambda: client.create_mixture(_mixture(a, {a: None})), "spec.name"),
        (lambda: client.create_mixture(_mixture(f"{unique}-m2", {f"{unique}-mix": None})), "spec.members[0].taskset"),
        (lambda: _taskset(client, tmp_path, f"{unique}-mix", 2), "spec.name"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            request()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(field)
