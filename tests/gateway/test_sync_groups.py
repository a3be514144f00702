"""Sync groups: the synchronizer section is the only source of their settings; `auto` picks the transport from
where the members' weights are (host, GPU)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from trinity.config import SynchronizerConfig
from trinity.gateway.sync_groups import SyncGroups, choose_backend
from trinity.runtime.errors import FailedPrecondition, InvalidArgument
from trinity.v1 import gateway_pb2


@pytest.fixture
def groups(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield SyncGroups(client)
    client.close()


def _request(run_id: str, sync: SynchronizerConfig, **changes: object) -> gateway_pb2.OpenSyncGroupRequest:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "instance_id": "trainer-1",
        "host": "127.0.0.1",
        "port": 29500,
        "backend": sync.method,
        "explorer_workers": 1,
        "timeout_seconds": sync.timeout_seconds,
        "bucket_mb": sync.bucket_mb,
    }
    return gateway_pb2.OpenSyncGroupRequest(**{**fields, **changes})


def test_a_group_carries_the_synchronizer_settings_it_was_opened_with(groups, unique):
    sync = SynchronizerConfig(method="gloo", timeout_seconds=7.5, bucket_mb=2.0)
    group = groups.open(_request(unique, sync))
    assert (group.backend, group.timeout_seconds, group.bucket_mb) == ("gloo", 7.5, 2.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"backend": ""}, "backend"), ({"timeout_seconds": 0.0}, "timeout_seconds"), ({"bucket_mb": 0.0}, "bucket_mb")],
)
def test_a_request_without_a_synchronizer_setting_is_refused_not_defaulted(groups, unique, changes, field):
    with pytest.raises(InvalidArgument) as info:
        groups.open(_request(unique, SynchronizerConfig(), **changes))
    assert info.value.field == field


# ---- which transport `auto` picks, from where the members' weights are -------------------------------------

HOST_A, HOST_B = "node-a/boot-1", "node-b/boot-2"


def _member(rank: int, host: str = HOST_A, gpus: tuple[str, ...] = ("GPU-0",), has_gpu: bool = True):
    return gateway_pb2.SyncMember(
        instance_id=f"m{rank}", rank=rank, has_gpu=has_gpu, host_id=host, gpu_uuids=list(gpus)
    )


@pytest.mark.parametrize(
    ("members", "backend"),
    [
        # trainer and every explorer on one GPU: NCCL cannot put two ranks there; CUDA IPC shares its memory
        ([_member(0), _member(1)], "cuda_ipc"),
        ([_member(0), _member(1), _member(2)], "cuda_ipc"),
        # each on a GPU of its own, on one host or several
        ([_member(0), _member(1, gpus=("GPU-1",)), _member(2, gpus=("GPU-2",))], "nccl"),
        ([_member(0), _member(1, host=HOST_B, gpus=("GPU-9",))], "nccl"),
        # two explorers share a GPU that is not the trainer's: neither NCCL nor CUDA IPC covers everyone
        ([_member(0), _member(1, gpus=("GPU-1",)), _member(2, gpus=("GPU-1",))], "gloo"),
        # an explorer on the trainer's GPU and one elsewhere
        ([_member(0), _member(1), _member(2, gpus=("GPU-1",))], "gloo"),
        # the same GPU id reported from another host is not shared memory
        ([_member(0), _member(1, host=HOST_B)], "gloo"),
        # any member without a GPU
        ([_member(0), _member(1, gpus=(), has_gpu=False)], "gloo"),
        ([_member(0, gpus=(), has_gpu=False), _member(1)], "gloo"),
        # GPU members that report no identity (older clients) count as GPUs of their own, as before identities
        ([_member(0, host="", gpus=()), _member(1, host="", gpus=())], "nccl"),
    ],
)
def test_auto_picks_the_transport_from_where_the_members_weights_are(members, backend):
    assert choose_backend("auto", members) == backend


@pytest.mark.parametrize(
    ("requested", "members"),
    [
        ("nccl", [_member(0), _member(1)]),  # two ranks on one GPU
        ("nccl", [_member(0), _member(1, gpus=(), has_gpu=False)]),
        ("cuda_ipc", [_member(0), _member(1, gpus=("GPU-1",))]),
        ("cuda_ipc", [_member(0), _member(1, host=HOST_B)]),
    ],
)
def test_an_explicit_method_that_cannot_serve_the_members_is_refused(requested, members):
    with pytest.raises(InvalidArgument) as info:
        choose_backend(requested, members)
    assert info.value.field == "synchronizer.method"


def test_explicit_methods_that_fit_are_kept():
    assert choose_backend("cuda_ipc", [_member(0), _member(1)]) == "cuda_ipc"
    assert choose_backend("nccl", [_member(0), _member(1, gpus=("GPU-1",))]) == "nccl"
    assert choose_backend("gloo", [_member(0), _member(1)]) == "gloo"


def test_a_group_of_members_on_the_trainers_gpu_is_formed_for_cuda_ipc(groups, unique):
    placement = {"has_gpu": True, "host_id": HOST_A, "gpu_uuids": ["GPU-0"]}
    groups.open(_request(unique, SynchronizerConfig(), explorer_workers=2, **placement))
    groups.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id="explorer-a", **placement))
    group = groups.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id="explorer-b", **placement))
    assert group.ready and group.backend == "cuda_ipc" and group.rank == 2
    assert [(m.rank, m.host_id, list(m.gpu_uuids)) for m in group.members] == [(r, HOST_A, ["GPU-0"]) for r in range(3)]


def test_an_explorer_with_several_engine_workers_takes_a_rank_for_each(groups, unique):
    """Tensor parallel 2 and 3 beside a one-worker explorer: ranks are consecutive per member, the world counts
    every worker, and the group is ready once every explorer (not every rank) joined."""
    groups.open(_request(unique, SynchronizerConfig(), explorer_workers=3))
    joins = [("explorer-a", 2), ("explorer-b", 0), ("explorer-c", 3)]
    replies = [groups.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id=i, ranks=r)) for i, r in joins]
    assert [reply.rank for reply in replies] == [1, 3, 4]
    assert [reply.ready for reply in replies] == [False, False, True]
    group = replies[-1]
    assert group.world_size == 1 + 2 + 1 + 3
    assert [(m.instance_id, m.rank, m.ranks) for m in group.members[1:]] == [
        ("explorer-a", 1, 2),
        ("explorer-b", 3, 0),
        ("explorer-c", 4, 3),
    ]
    # Joining again answers with the member's first rank; a fourth explorer finds the generation full.
    again = groups.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id="explorer-a", ranks=2))
    assert again.rank == 1 and again.world_size == 7
    with pytest.raises(FailedPrecondition, match="is full"):
        groups.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id="explorer-d"))


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        ({"ranks": -1}, "ranks"),
        ({"ranks": 65}, "ranks"),
        ({"has_gpu": True, "gpu_uuids": ["GPU-0"] * 65}, "gpu_uuids"),
        ({"has_gpu": True, "gpu_uuids": ["x" * 600]}, "gpu_uuids"),
        ({"has_gpu": False, "gpu_uuids": ["GPU-0"]}, "gpu_uuids"),
        ({"host_id": "h" * 600}, "host_id"),
    ],
)
def test_a_member_placement_out_of_bounds_is_refused_naming_the_field(groups, unique, placement, field):
    groups.open(_request(unique, SynchronizerConfig()))
    with pytest.raises(InvalidArgument) as info:
        groups.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id="explorer-a", **placement))
    assert info.value.field == field


# ---- the secrets of a run's process groups (a gateway with a token) ---------------------------------------------


@pytest.fixture
def groups_with_secrets(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield SyncGroups(client, issue_secrets=True)
    client.close()


def test_every_generation_gets_a_secret_of_its_own_that_joining_members_receive(groups_with_secrets, unique):
    first = groups_with_secrets.open(_request(unique, SynchronizerConfig()))
    joined = groups_with_secrets.join(gateway_pb2.JoinSyncGroupRequest(run_id=unique, instance_id="explorer-a"))
    second = groups_with_secrets.open(_request(unique, SynchronizerConfig()))
    assert len(first.secret) == 32 and joined.secret == first.secret
    assert groups_with_secrets.get(unique).secret == second.secret != first.secret


def test_a_run_has_one_rank_secret_for_the_leader_and_every_follower(groups_with_secrets, unique):
    secret = groups_with_secrets.rank_secret(unique)
    assert len(secret) == 32 and groups_with_secrets.rank_secret(unique) == secret
    assert groups_with_secrets.rank_secret(unique + "-other") != secret


def test_a_gateway_without_a_token_hands_out_no_secrets(groups, unique):
    # Anyone may call such a gateway, so a secret would keep nobody out: the groups form as they always did.
    assert groups.open(_request(unique, SynchronizerConfig())).secret == b""
    assert groups.rank_secret(unique) == b""
