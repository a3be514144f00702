"""A bounded fuzz of every RPC: 100 random and mutated requests per method found by server reflection, against
the four services as real processes with a bearer token set (the explorer serving a tiny model, so that Generate
gets past "no model"). No call may end UNKNOWN or INTERNAL, and every service is alive and SERVING afterwards.

The seed is fixed: a failure names the method and the request, and reruns the same way.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from tests.security.fuzz import Method, RequestFactory, call, call_detailed, corrupt_bytes, discover
from trinity.clients import BufferClient
from trinity.config import StreamConfig, TaskSetConfig
from trinity.runtime.client import open_channel
from trinity.runtime.redis_server import start_redis_server
from trinity.sdk import TrinityClient
from trinity.v1 import buffer_pb2, explorer_pb2, explorer_pb2_grpc, gateway_pb2, trainer_pb2

SEED = 1313
PER_METHOD = 100
CORRUPT_PER_METHOD = 20
# A length-delimited field 1 that claims 127 bytes and has none: no message type parses it.
TRUNCATED = b"\x0a\x7f"
TOKEN = "fuzz-token"
CALL_TIMEOUT = 20.0
BAD_CODES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
# Explorer first (Generate needs the serve run that later calls may stop), and deletes last in each service.
SERVICE_ORDER = ("trinity.v1.ExplorerService", "trinity.v1.BufferService", "trinity.v1.TrainerService")
CONTRACTS = (buffer_pb2, explorer_pb2, gateway_pb2, trainer_pb2)
LONG_POLL = buffer_pb2.ReadExperiencesRequest.DESCRIPTOR.full_name


@dataclass
class Stack:
    services: dict[str, ServiceProcess]
    model: Path
    data_root: Path
    run_id: str = ""

    def generate(self, request: explorer_pb2.GenerateRequest) -> explorer_pb2.GenerateResponse:
        with open_channel(self.services["explorer"].address, token=TOKEN) as channel:
            return explorer_pb2_grpc.ExplorerServiceStub(channel).Generate(request, timeout=CALL_TIMEOUT)

    def serving(self) -> Stack:
        """The stack with a serve-mode run whose model the explorer has loaded: a new run if the last one ended
        (fuzzed StopRun and CancelRun calls end it)."""
        try:
            self.generate(explorer_pb2.GenerateRequest(prompt="1+1?", max_tokens=1))
            return self
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
        config = {
            "name": "fuzz",
            "mode": "serve",
            "model": {"path": str(self.model), "max_prompt_tokens": 48, "max_response_tokens": 8},
            "explorer": {"engine": "transformers"},
        }
        with TrinityClient(self.services["gateway"].address, token=TOKEN) as client:
            self.run_id = client.create_run(config).id
        deadline = time.monotonic() + 120
        while True:
            try:
                self.generate(explorer_pb2.GenerateRequest(prompt="1+1?", max_tokens=1))
                return self
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)


@dataclass(frozen=True)
class Outcome:
    method: Method
    request: str
    code: grpc.StatusCode


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Stack]:
    redis = start_redis_server()  # a private one: the gateway's run and instance counts are the fuzz's alone
    root = tmp_path_factory.mktemp("fuzz-data")
    (root / "tasks.jsonl").write_text(json.dumps({"prompt": "1+1?", "answer": "2", "response": "2"}) + "\n")
    env = {"TRINITY_REDIS_URL": redis.url, "TRINITY_AUTH_TOKEN": TOKEN, "TRINITY_DATA_ROOTS": str(root)}
    services: dict[str, ServiceProcess] = {}
    try:
        services["gateway"] = ServiceProcess("gateway", env=env).start()
        env["TRINITY_GATEWAY"] = services["gateway"].address
        for name in ("buffer", "trainer", "explorer"):
            services[name] = ServiceProcess(name, env=env).start(timeout=120)
        with BufferClient(services["buffer"].address, token=TOKEN) as buffer:  # what plausible requests name
            buffer.create_stream(StreamConfig(name="fuzz"))
            buffer.put("fuzz", [experience(), experience()])
            buffer.create_taskset(TaskSetConfig(name="fuzz-tasks", path=str(root / "tasks.jsonl")))
        yield Stack(services, tiny_model, root).serving()
    finally:
        for service in reversed(list(services.values())):
            service.stop()
        redis.stop()


def _plausible(stack: Stack) -> dict[str, object]:
    return {
        "stream": "fuzz",
        "name": "fuzz",
        "taskset": "fuzz-tasks",
        "consumer": "fuzz-consumer",
        "run_id": stack.run_id,
        "instance_id": "fuzz-instance",
        "path": str(stack.data_root / "tasks.jsonl"),
        "batch_size": 2,
        "prompt": "1+1?",
        "max_tokens": 2,
        "response_key": "response",
        "kind": 2,
        "entry_ids": ["1-0"],
        "lease_id": "0",
    }


def _ordered(methods: list[Method]) -> list[Method]:
    def key(m: Method) -> tuple[int, bool, str]:
        rank = SERVICE_ORDER.index(m.service) if m.service in SERVICE_ORDER else len(SERVICE_ORDER)
        return rank, m.name.startswith(("Delete", "Stop", "Cancel")), m.name

    return sorted(methods, key=key)


def _methods(stack: Stack) -> list[Method]:
    methods = []
    for service in stack.services.values():
        with grpc.insecure_channel(service.address) as channel:  # reflection needs no token
            methods += discover(channel)
    return _ordered(methods)


@pytest.fixture(scope="module")
def outcomes(stack: Stack) -> list[Outcome]:
    factory = RequestFactory(random.Random(SEED), _plausible(stack))
    by_service = {s: p for p in stack.services.values() for s in _served(p)}
    results = []
    for method in _methods(stack):
        with open_channel(by_service[method.service].address, token=TOKEN) as channel:
            for request in factory.requests(method, PER_METHOD):
                if request.DESCRIPTOR.full_name == LONG_POLL and request.block_ms > 0:
                    request.block_ms = 100  # long polls are the starvation test's subject, not this one's
                timeout = 3.0 if method.streaming else CALL_TIMEOUT  # a watch of a live run ends at its deadline
                code = call(channel, method, request, timeout)
                results.append(Outcome(method, str(request)[:300], code))
    counts = Counter(o.code.name for o in results)
    print(f"\nfuzz: {len(results)} calls over {len({o.method.path for o in results})} methods: {dict(counts)}")
    for service in sorted({o.method.service for o in results}):
        mine = Counter(o.code.name for o in results if o.method.service == service)
        print(f"  {service}: {dict(mine)}")
    return results


@pytest.fixture(scope="module")
def corrupt_outcomes(stack: Stack) -> list[Outcome]:
    """CORRUPT_PER_METHOD requests of bytes, truncated or bit-flipped, per method (after the typed fuzz)."""
    rng, factory = random.Random(SEED + 1), RequestFactory(random.Random(SEED), _plausible(stack))
    by_service = {s: p for p in stack.services.values() for s in _served(p)}
    results = []
    for method in _methods(stack):
        valid = next(factory.requests(method, 1)).SerializeToString()
        with open_channel(by_service[method.service].address, token=TOKEN) as channel:
            for _ in range(CORRUPT_PER_METHOD):
                data = corrupt_bytes(rng, valid)
                code = call(channel, method, data, 3.0 if method.streaming else CALL_TIMEOUT)
                results.append(Outcome(method, data.hex()[:300], code))
    print(f"\ncorrupt fuzz: {len(results)} calls: {dict(Counter(o.code.name for o in results))}")
    return results


def test_no_corrupt_request_ends_unknown_or_internal(corrupt_outcomes, stack):
    bad = [f"{o.method.path}: {o.code.name} for bytes {o.request}" for o in corrupt_outcomes if o.code in BAD_CODES]
    assert not bad, "\n".join(bad[:20])
    # Most of them do not parse at all, and are refused as such (a flipped bit may still leave a valid message).
    refused = sum(o.code == grpc.StatusCode.INVALID_ARGUMENT for o in corrupt_outcomes)
    assert refused >= len(corrupt_outcomes) // 2


def test_bytes_that_do_not_parse_are_invalid_argument_naming_the_type(stack):
    by_service = {s: p for p in stack.services.values() for s in _served(p)}
    wrong = {}
    for method in _methods(stack):
        with open_channel(by_service[method.service].address, token=TOKEN) as channel:
            code, details = call_detailed(channel, method, TRUNCATED, CALL_TIMEOUT)
        expected = f"request: not a valid {method.request.DESCRIPTOR.full_name}"
        if code != grpc.StatusCode.INVALID_ARGUMENT or not details.startswith(expected):
            wrong[method.path] = (code.name, details)
    assert wrong == {}


def test_corrupt_bytes_without_the_token_are_refused_as_unauthenticated(stack):
    method = next(m for m in _methods(stack) if m.name == "GetStatus")
    address = next(p.address for p in stack.services.values() if method.service in _served(p))
    with open_channel(address, token="not-the-token") as channel:
        assert call(channel, method, TRUNCATED, CALL_TIMEOUT) == grpc.StatusCode.UNAUTHENTICATED


def _served(process: ServiceProcess) -> list[str]:
    with grpc.insecure_channel(process.address) as channel:
        return [m.service for m in discover(channel)]


def test_reflection_lists_every_method_of_the_contracts(stack):
    found = {m.path for m in _methods(stack)}
    defined = {
        f"/{service.full_name}/{method.name}"
        for module in CONTRACTS
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert found == defined


def test_no_request_ends_unknown_or_internal(outcomes, stack):
    bad: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.code in BAD_CODES:
            bad.setdefault(o.method.path, []).append(o)
    report = [f"{path}: {len(found)} x {found[0].code.name}, e.g. {found[0].request!r}" for path, found in bad.items()]
    tracebacks = [f"--- {name}:\n{_failures(service.logs())}" for name, service in stack.services.items()]
    assert not bad, "\n".join(report + tracebacks)


def _failures(log: str) -> str:
    """The log lines around each failed call (gRPC's "Exception calling application", our "rpc.failed")."""
    lines = log.splitlines()
    marks = [i for i, line in enumerate(lines) if "Exception calling application" in line or "rpc.failed" in line]
    return "\n".join("\n".join(lines[i : i + 25])[:3000] for i in marks[:3])


def test_every_method_got_its_requests(outcomes, stack):
    per_method = Counter(o.method.path for o in outcomes)
    assert set(per_method.values()) == {PER_METHOD}
    assert len(per_method) == len(_methods(stack))


def test_every_service_is_alive_and_serving_after_the_fuzz(outcomes, stack):
    for name, service in stack.services.items():
        assert service.process is not None and service.process.poll() is None, f"{name} died:\n{service.logs()[-3000:]}"
        with grpc.insecure_channel(service.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, name


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["missing", "wrong"])
def test_every_method_refuses_a_call_without_the_right_token(stack, token):
    factory = RequestFactory(random.Random(SEED), _plausible(stack))
    by_service = {s: p for p in stack.services.values() for s in _served(p)}
    codes = {}
    for method in _methods(stack):
        with open_channel(by_service[method.service].address, token=token or "") as channel:
            codes[method.path] = call(channel, method, next(factory.requests(method, 1)), CALL_TIMEOUT)
    assert {path for path, code in codes.items() if code != grpc.StatusCode.UNAUTHENTICATED} == set()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n": -1}, "n"),
        ({"n": 1_000_000}, "n"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"prompt": "one two three " * 20}, "prompt"),  # 48 + 8 tokens of context; this is 280 byte tokens
    ],
)
def test_generate_refuses_a_bad_value_naming_the_field(stack, fields, named):
    request = explorer_pb2.GenerateRequest(**{"prompt": "1+1?", **fields})
    with pytest.raises(grpc.RpcError) as info:
        stack.serving().generate(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{named}:")


def test_generate_within_the_limits_samples_n_responses(stack):
    request = explorer_pb2.GenerateRequest(prompt="1+1?", n=3, max_tokens=2, temperature=1.0, top_p=0.9)
    reply = stack.serving().generate(request)
    assert len(reply.samples) == 3
