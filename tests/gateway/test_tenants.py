"""Named tokens with quotas (docs/tenants.md): the tenants file read and refused at start, and a real gateway process
with a token and a tenants file answering each tenant: its runs recorded with tenant, priority and queue time, each
refusal's status and message, another tenant's runs out of reach, the services' calls closed to tenants; the SDK and
the CLI against it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from pydantic import ValidationError

from tests.conftest import ServiceProcess
from tests.gateway.run_harness import run_config
from trinity.cli.main import main
from trinity.runtime.client import open_channel
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.tenants import MAX_PRIORITY, TenantBook, TenantsFile, token_sha256
from trinity.sdk import NotPermitted, QuotaExceeded, TrinityClient
from trinity.sdk.errors import InvalidRequest
from trinity.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

OPERATOR, ALICE, BOB = "operator-token", "alice-token", "bob-token"
TENANTS = {
    "tenants": [
        {
            "name": "alice",
            "token_sha256": token_sha256(ALICE),
            "quotas": {"runs": 2, "explorers": 2, "trainer_ranks": 1},
            "max_priority": 50,
        },
        {"name": "bob", "token_sha256": token_sha256(BOB).upper()},  # hex digits of either case
    ]
}
DENIED, EXHAUSTED = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.RESOURCE_EXHAUSTED


def _write(path: Path, content: object) -> Path:
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


@pytest.fixture(scope="module")
def tenants_file(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("tenants") / "tenants.yaml", TENANTS)


@pytest.fixture(scope="module")
def gateway(tenants_file) -> Iterator[ServiceProcess]:
    """A gateway process of its own (its own embedded Redis) with the operator's token and the tenants file; no
    explorer or trainer registers, so every run stays pending."""
    env = {"TRINITY_AUTH_TOKEN": OPERATOR, "TRINITY_TENANTS_FILE": str(tenants_file), "TRINITY_REDIS_URL": ""}
    service = ServiceProcess("gateway", env=env).start()
    yield service
    service.stop()


@pytest.fixture
def clients(gateway) -> Iterator[dict[str, TrinityClient]]:
    """An SDK client per token; every run still pending afterwards is cancelled (quotas count them)."""
    made = {name: TrinityClient(gateway.address, token=token) for name, token in (("op", OPERATOR), ("alice", ALICE))}
    made["bob"] = TrinityClient(gateway.address, token=BOB)
    yield made
    for run in made["op"].list_runs():
        made["op"].run(run.id).cancel("test over")
    for client in made.values():
        client.close()


def _call(address: str, token: str, method: str, request: object) -> object:
    with open_channel(address, token=token) as channel:
        return getattr(gateway_pb2_grpc.GatewayServiceStub(channel), method)(request, timeout=30)


def _pending(client: TrinityClient) -> list[gateway_pb2.Run]:
    """The runs the client's tenant lists that earlier tests have not ended."""
    return [run for run in client.list_runs() if run.state == gateway_pb2.RUN_STATE_PENDING]


def _refusal(address: str, token: str, method: str, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _call(address, token, method, request)
    return info.value


# ---- the file -------------------------------------------------------------------------------------------------------


def test_a_tenants_file_gives_each_token_its_tenant_and_quotas_unset_ones_unlimited(tenants_file):
    book = TenantBook(TenantsFile.load(tenants_file))
    alice, bob = book.caller(f"Bearer {ALICE}"), book.caller(f"Bearer {BOB}")
    assert alice is not None and bob is not None
    assert (alice.name, alice.quotas.runs, alice.quotas.explorers, alice.quotas.trainer_ranks) == ("alice", 2, 2, 1)
    assert (bob.name, bob.quotas.runs, bob.quotas.explorers, bob.max_priority) == ("bob", None, None, MAX_PRIORITY)
    assert book.caller(f"Bearer {OPERATOR}") is None and book.caller(ALICE) is None and book.tenant("bob") == bob


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("tenants: [", "while parsing"),
        ({"people": []}, "must hold one key, tenants"),
        ({"tenants": [{"name": "alice", "token_sha256": "abc"}]}, "tenants.0.token_sha256: String should match"),
        (
            {"tenants": [{"name": "alice", "token_sha256": token_sha256(ALICE), "quotas": {"runs": -1}}]},
            "tenants.0.quotas.runs: Input should be greater than or equal to 0",
        ),
        (
            {"tenants": [{"name": "alice", "token_sha256": token_sha256(ALICE), "quotas": {"gpus": 1}}]},
            "tenants.0.quotas.gpus: unknown field",
        ),
        (
            {"tenants": [{"name": "alice", "token_sha256": token_sha256(ALICE), "max_priority": 101}]},
            "tenants.0.max_priority: Input should be less than or equal to 100",
        ),
        (
            {"tenants": [{"name": n, "token_sha256": token_sha256(n)} for n in ("alice", "alice")]},
            "two tenants share the name alice",
        ),
        (
            {"tenants": [{"name": n, "token_sha256": token_sha256(ALICE)} for n in ("alice", "bob")]},
            f"two tenants share the token_sha256 {token_sha256(ALICE)}",
        ),
        (
            {"tenants": [{"name": "alice", "token_sha256": token_sha256(OPERATOR)}]},
            "a tenant's token_sha256 is the digest of TRINITY_AUTH_TOKEN",
        ),
    ],
)
def test_a_bad_tenants_file_stops_the_gateway_naming_the_field(tmp_path, monkeypatch, content, message):
    path = _write(tmp_path / "tenants.yaml", content)
    monkeypatch.setenv("TRINITY_AUTH_TOKEN", OPERATOR)
    monkeypatch.setenv("TRINITY_TENANTS_FILE", str(path))
    with pytest.raises(ValidationError) as info:
        ServiceSettings.from_env("gateway")
    text = str(info.value)
    assert "tenants_file" in text and message in text
    assert ServiceSettings.from_env("buffer").tenants_file is None  # the gateway's setting only


def test_a_missing_tenants_file_or_one_without_the_operator_token_stops_the_gateway(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_TENANTS_FILE", str(tmp_path / "absent.yaml"))
    monkeypatch.setenv("TRINITY_AUTH_TOKEN", OPERATOR)
    with pytest.raises(ValidationError, match=r"tenants_file\n.*absent.yaml: \[Errno 2\]"):
        ServiceSettings.from_env("gateway")
    monkeypatch.setenv("TRINITY_TENANTS_FILE", str(_write(tmp_path / "tenants.yaml", TENANTS)))
    monkeypatch.delenv("TRINITY_AUTH_TOKEN")
    with pytest.raises(ValidationError, match="tenants need TRINITY_AUTH_TOKEN"):
        ServiceSettings.from_env("gateway")


@pytest.mark.parametrize("entrypoint", [["-m", "trinity.cli", "serve"], ["-m", "trinity.runtime.serve"]])
def test_a_gateway_started_with_a_bad_tenants_file_exits_2_naming_it(tmp_path, entrypoint):
    path = _write(tmp_path / "tenants.yaml", {"tenants": [{"name": "alice", "token_sha256": "abc"}]})
    env = {**os.environ, "TRINITY_AUTH_TOKEN": OPERATOR, "TRINITY_TENANTS_FILE": str(path)}
    done = subprocess.run(
        [sys.executable, *entrypoint, "gateway", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert f"tenants_file: {path}: tenants.0.token_sha256" in done.stderr


# ---- creating runs --------------------------------------------------------------------------------------------------


def test_a_tenants_run_records_its_tenant_priority_and_queue_time_and_the_operators_no_tenant(clients, unique):
    run = clients["alice"].create_run(run_config(name=unique), priority=7).status()
    assert (run.tenant, run.priority, run.state) == ("alice", 7, gateway_pb2.RUN_STATE_PENDING)
    assert run.queued_unix_ms == run.created_unix_ms > 0
    own = clients["op"].create_run(run_config(name=unique + "-op"), priority=MAX_PRIORITY).status()
    assert (own.tenant, own.priority) == ("", MAX_PRIORITY)


def test_runs_beyond_the_tenants_runs_quota_are_refused_until_one_ends(clients, gateway, unique):
    first = clients["alice"].create_run(run_config(name=unique))
    request = gateway_pb2.CreateRunRequest(config_yaml=run_config(name=unique), request_id=uuid.uuid4().hex)
    second = _call(gateway.address, ALICE, "CreateRun", request)
    with pytest.raises(QuotaExceeded, match=r"^tenant alice has 2 runs pending, running or paused: its quota runs=2$"):
        clients["alice"].create_run(run_config(name=unique))
    fresh = gateway_pb2.CreateRunRequest(config_yaml=run_config(name=unique))
    assert _refusal(gateway.address, ALICE, "CreateRun", fresh).code() == EXHAUSTED
    assert _call(gateway.address, ALICE, "CreateRun", request).id == second.id  # a retry gets its run, quota or not
    clients["bob"].create_run(run_config(name=unique))  # another tenant's quota is its own

    first.cancel()
    assert clients["alice"].create_run(run_config(name=unique)).status().tenant == "alice"


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"explorer": {"num_workers": 3}}, "tenant alice's quota explorers=2: stage 0 asks for explorer.num_workers=3"),
        (
            {"stages": ({}, {"explorer": {"num_workers": 3}})},
            "tenant alice's quota explorers=2: stage 2 asks for explorer.num_workers=3",
        ),
        (
            {"trainer": {"data_parallel_size": 2}},
            "tenant alice's quota trainer_ranks=1: stage 0 asks for a trainer of 2",
        ),
        (
            {"trainer": {"backend": "megatron", "tensor_parallel_size": 2}},
            "tenant alice's quota trainer_ranks=1: stage 0 asks for a trainer of 2 ranks",
        ),
    ],
)
def test_a_config_beyond_the_tenants_explorers_or_trainer_ranks_is_refused_naming_the_quota(
    clients, gateway, unique, top, message
):
    config = run_config(name=unique, **top)
    with pytest.raises(QuotaExceeded) as info:
        clients["alice"].create_run(config)
    assert str(info.value).startswith(message)
    assert _refusal(gateway.address, ALICE, "CreateRun", gateway_pb2.CreateRunRequest(config_yaml=config)).code() == (
        EXHAUSTED
    )
    assert clients["bob"].create_run(config).status().tenant == "bob"  # no quotas: accepted


def test_a_priority_out_of_range_is_invalid_and_one_above_the_tenants_maximum_not_permitted(clients, gateway, unique):
    for priority in (-1, MAX_PRIORITY + 1):
        with pytest.raises(InvalidRequest, match=rf"^priority: must be between 0 and 100, got {priority}$"):
            clients["op"].create_run(run_config(name=unique), priority=priority)
    with pytest.raises(NotPermitted, match=r"^tenant alice may queue runs at priority 50 at most"):
        clients["alice"].create_run(run_config(name=unique), priority=51)
    request = gateway_pb2.CreateRunRequest(config_yaml=run_config(name=unique), priority=51)
    assert _refusal(gateway.address, ALICE, "CreateRun", request).code() == DENIED
    assert clients["alice"].create_run(run_config(name=unique), priority=50).status().priority == 50


# ---- whose runs -----------------------------------------------------------------------------------------------------


def test_a_tenant_cannot_touch_another_tenants_run_and_lists_only_its_own(clients, gateway, unique):
    bobs = clients["bob"].create_run(run_config(name=unique + "-bob")).id
    alices = clients["alice"].create_run(run_config(name=unique + "-alice")).id
    requests = {
        "GetRun": gateway_pb2.GetRunRequest(run_id=bobs),
        "CancelRun": gateway_pb2.CancelRunRequest(run_id=bobs),
        "GetRunSpans": gateway_pb2.GetRunSpansRequest(run_id=bobs),
        "ScaleRun": gateway_pb2.ScaleRunRequest(run_id=bobs, explorers=1),
        "SteerRun": gateway_pb2.SteerRunRequest(run_id=bobs, steering=common_pb2.Steering(temperature=0.5)),
        "PauseRun": gateway_pb2.PauseRunRequest(run_id=bobs),
        "ResumeRun": gateway_pb2.ResumeRunRequest(run_id=bobs),
    }
    for method, request in requests.items():
        err = _refusal(gateway.address, ALICE, method, request)
        assert (method, err.code(), err.details()) == (
            method,
            DENIED,
            f"run {bobs} is not a run of tenant alice; a tenant acts on its own runs",
        )
    with open_channel(gateway.address, token=ALICE) as channel, pytest.raises(grpc.RpcError) as info:
        list(gateway_pb2_grpc.GatewayServiceStub(channel).WatchRun(gateway_pb2.WatchRunRequest(run_id=bobs)))
    assert info.value.code() == DENIED
    with pytest.raises(NotPermitted):
        clients["alice"].run(bobs)

    assert clients["bob"].run(bobs).status().state == gateway_pb2.RUN_STATE_PENDING  # nothing happened to it
    assert {r.tenant for r in clients["alice"].list_runs()} == {"alice"}  # ended ones of earlier tests too
    assert [r.id for r in _pending(clients["alice"])] == [alices]
    assert [r.id for r in _pending(clients["bob"])] == [bobs]
    assert {r.id for r in _pending(clients["op"])} == {alices, bobs}
    assert clients["op"].run(bobs).status().tenant == "bob"  # the operator sees and acts on every run


def test_a_tenants_token_opens_only_the_runs_api_and_an_unknown_token_nothing(gateway):
    instance = gateway_pb2.Instance(instance_id="rogue", service="explorer", address="127.0.0.1:1")
    service_calls = {
        "Register": gateway_pb2.RegisterRequest(instance=instance),
        "ReportEvent": gateway_pb2.ReportEventRequest(),
        "GetRankSecret": gateway_pb2.GetRankSecretRequest(run_id="any"),
        "GetSyncGroup": gateway_pb2.GetSyncGroupRequest(run_id="any"),
    }
    for method, request in service_calls.items():
        err = _refusal(gateway.address, ALICE, method, request)
        assert (method, err.code()) == (method, DENIED) and "only the runs API" in err.details()
    assert _call(gateway.address, BOB, "GetStatus", common_pb2.GetStatusRequest())
    err = _refusal(gateway.address, "nobody", "ListRuns", gateway_pb2.ListRunsRequest())
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED


def test_trinity_submit_queues_at_a_priority_and_exits_2_naming_a_bad_one(
    clients, gateway, unique, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("TRINITY_AUTH_TOKEN", "")  # --token-file sets it for the command: put back afterwards
    config = _write(tmp_path / "run.yaml", run_config(name=unique))
    token = _write(tmp_path / "token", ALICE)
    submit = ["submit", "--config", str(config), "--gateway", gateway.address, "--token-file", str(token)]
    assert main([*submit, "--priority", "9"]) == 0
    assert [(r.tenant, r.priority) for r in _pending(clients["alice"])] == [("alice", 9)]
    for bad in ("101", "high"):
        with pytest.raises(SystemExit) as exited:
            main([*submit, "--priority", bad])
        assert exited.value.code == 2 and "argument --priority" in capsys.readouterr().err
    assert main([*submit, "--priority", "51"]) == 1
    assert "tenant alice may queue runs at priority 50 at most" in capsys.readouterr().err
