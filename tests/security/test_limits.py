"""Bounded input: run configs without alias bombs and under 1 MiB, limits on names, repeated fields and token
counts, status details cut short, values out of range refused naming the field, and a cap on active runs."""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import pytest

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from trinity.clients import BufferClient
from trinity.config import ConfigError, StreamConfig, TaskSetConfig, parse_run_config
from trinity.runtime.client import open_channel
from trinity.runtime.limits import (
    MAX_ACTIVE_RUNS,
    MAX_CONFIG_BYTES,
    MAX_ERROR_DETAIL_BYTES,
    MAX_EXPERIENCE_TOKENS,
    MAX_ITEMS,
)
from trinity.runtime.redis_server import start_redis_server
from trinity.v1 import buffer_pb2, buffer_pb2_grpc, gateway_pb2, gateway_pb2_grpc

# Each alias level repeats the one before ten times: 10**3 strings from a few lines.
ALIAS_BOMB = """
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
model: {path: m}
"""
SERVE = "name: capped\nmode: serve\nmodel: {path: /nowhere}\n"


@pytest.fixture(scope="module")
def gateway() -> Iterator[gateway_pb2_grpc.GatewayServiceStub]:
    """A gateway alone on a private Redis: no service registers, so the runs it accepts stay pending."""
    redis = start_redis_server()
    service = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis.url}).start()
    try:
        with open_channel(service.address) as channel:
            yield gateway_pb2_grpc.GatewayServiceStub(channel)
    finally:
        service.stop()
        redis.stop()


@pytest.fixture
def buffer(buffer_service) -> Iterator[BufferClient]:
    with BufferClient(buffer_service.address) as client:
        yield client


@pytest.fixture
def buffer_stub(buffer_service) -> Iterator[buffer_pb2_grpc.BufferServiceStub]:
    with open_channel(buffer_service.address) as channel:
        yield buffer_pb2_grpc.BufferServiceStub(channel)


def _refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# ---- run configs -------------------------------------------------------------------------------------------------


def test_a_config_with_yaml_aliases_is_refused_before_it_expands():
    with pytest.raises(ConfigError, match="YAML anchors/aliases are not allowed"):
        parse_run_config(ALIAS_BOMB)


def test_a_config_over_one_mib_is_refused():
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        parse_run_config("model: {path: m}\n" + "#" * MAX_CONFIG_BYTES)


def test_a_config_nested_past_the_parser_is_refused_as_a_config_error():
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_run_config("[" * 100_000)


def test_create_run_refuses_an_alias_bomb_with_invalid_argument(gateway):
    err = _refusal(lambda: gateway.CreateRun(gateway_pb2.CreateRunRequest(config_yaml=ALIAS_BOMB), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "anchors/aliases" in err.details()


def test_create_run_refuses_a_malformed_run_id(gateway):
    request = gateway_pb2.CreateRunRequest(config_yaml=SERVE, run_id="../x" * 50)
    err = _refusal(lambda: gateway.CreateRun(request, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("run_id:")


def test_create_run_refuses_runs_beyond_the_active_limit(gateway):
    created = []
    try:
        for _ in range(MAX_ACTIVE_RUNS):
            created.append(gateway.CreateRun(gateway_pb2.CreateRunRequest(config_yaml=SERVE), timeout=10).id)
        err = _refusal(lambda: gateway.CreateRun(gateway_pb2.CreateRunRequest(config_yaml=SERVE), timeout=10))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "cancel" in err.details()
    finally:
        for run_id in created:
            gateway.CancelRun(gateway_pb2.CancelRunRequest(run_id=run_id), timeout=10)


# ---- sizes and values --------------------------------------------------------------------------------------------


def test_a_ten_kb_name_gets_a_short_invalid_argument_naming_the_field(buffer_stub):
    err = _refusal(lambda: buffer_stub.GetStream(buffer_pb2.GetStreamRequest(name="n" * 10_000), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("name:")
    assert len(err.details()) < 200


def test_a_message_echoing_a_long_input_is_cut_to_the_detail_limit(buffer):
    path = "/" + "p" * 4000  # within the path limit, outside the data roots: the refusal quotes it
    err = _refusal(lambda: buffer.create_taskset(TaskSetConfig(name="long-path", path=path)))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert len(err.details().encode()) <= MAX_ERROR_DETAIL_BYTES and err.details().endswith("bytes cut)")


def test_an_experience_over_the_token_limit_is_refused(buffer, unique):
    buffer.create_stream(StreamConfig(name=unique))
    huge = experience(tokens=MAX_EXPERIENCE_TOKENS)
    err = _refusal(lambda: buffer.put(unique, [huge]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("experiences[0].response_token_ids:")


def test_more_ids_than_one_request_may_carry_are_refused_naming_the_field(buffer, unique):
    buffer.create_stream(StreamConfig(name=unique))
    err = _refusal(lambda: buffer.nack(unique, "c", [f"{i}-0" for i in range(MAX_ITEMS + 1)]))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.details().startswith("entry_ids:")


def test_an_entry_id_redis_would_refuse_is_invalid_argument(buffer, unique):
    buffer.create_stream(StreamConfig(name=unique))
    err = _refusal(lambda: buffer.ack(unique, ["not-an-id"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("entry_ids[0]:")


def test_a_nan_pass_rate_is_invalid_argument(buffer_stub, buffer, unique, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "p"}\n')
    buffer.create_taskset(TaskSetConfig(name=unique, path=str(tasks)))
    result = buffer_pb2.TaskResult(lease_id="0", task_id=f"{unique}/0", pass_rate=math.nan)
    request = buffer_pb2.CompleteTasksRequest(taskset=unique, consumer="c", results=[result])
    err = _refusal(lambda: buffer_stub.CompleteTasks(request, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("results[0].pass_rate:")


def test_a_lease_of_nan_seconds_is_invalid_argument(buffer_stub, buffer, unique, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "p"}\n')
    buffer.create_taskset(TaskSetConfig(name=unique, path=str(tasks)))
    request = buffer_pb2.LeaseTasksRequest(taskset=unique, consumer="c", batch_size=1, lease_seconds=math.nan)
    err = _refusal(lambda: buffer_stub.LeaseTasks(request, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("lease_seconds:")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"explorer_workers": 2**31 - 1}, "explorer_workers"),
        ({"timeout_seconds": math.nan}, "timeout_seconds"),
        ({"bucket_mb": math.inf}, "bucket_mb"),
        ({"port": 70_000}, "port"),
    ],
)
def test_open_sync_group_refuses_a_value_out_of_range_naming_the_field(gateway, fields, named):
    values = {"run_id": "r", "instance_id": "t", "host": "127.0.0.1", "port": 29500, "backend": "gloo"}
    values |= {"explorer_workers": 1, "timeout_seconds": 60.0, "bucket_mb": 64.0, **fields}
    err = _refusal(lambda: gateway.OpenSyncGroup(gateway_pb2.OpenSyncGroupRequest(**values), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(named)


def test_a_long_string_deep_in_a_spec_is_refused_naming_its_place(buffer_stub, unique):
    operator = buffer_pb2.OperatorSpec(name="reward_filter", options={"mode": "m" * 10_000})
    spec = buffer_pb2.StreamSpec(name=unique, operators=[operator])
    err = _refusal(lambda: buffer_stub.CreateStream(buffer_pb2.CreateStreamRequest(spec=spec), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("spec.operators[0].options['mode']:")
