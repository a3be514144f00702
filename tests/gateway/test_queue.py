"""The run queue and the explorer pool (trinity.gateway.queue): pending runs start by priority then arrival, a waiting
run holds back what it needs while lower runs backfill with the rest, a tenant's run waits for its quota, the pending
timeout spares runs that only wait their turn; free explorers are dealt fairly and a pending run gets explorers back
from lower runs' spare. On real Redis and a real buffer with in-process explorers and trainers (tests/gateway/
run_harness.py); ScaleRun's quota through the gateway's servicer on a real gRPC server."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from tests.gateway.run_harness import EXAMPLES, FakeService, run_config
from trinity.runtime.client import open_channel
from trinity.runtime.tenants import OPERATOR, Quotas, Tenant, TenantBook, TenantsFile, token_sha256
from trinity.v1 import gateway_pb2, gateway_pb2_grpc

PENDING, RUNNING = gateway_pb2.RUN_STATE_PENDING, gateway_pb2.RUN_STATE_RUNNING
SFT = {
    "batch_size": 2,
    "train_batch_size": 2,
    "total_steps": 1,
    "offline_data": {"path": str(EXAMPLES.parent / "sft" / "train.jsonl"), "messages_key": "messages"},
}
TRAIN_ONLY = {"mode": "train", "algorithm": {"algorithm_type": "sft"}, "buffer": SFT}


def _tenants(harness, **quotas: Quotas) -> dict[str, Tenant]:
    """Tenants named after their tokens, with these quotas, known to the harness's gateway."""
    tenants = {name: Tenant(name=name, token_sha256=token_sha256(name), quotas=q) for name, q in quotas.items()}
    harness.orchestrator.ledger.tenants = TenantBook(
        TenantsFile(path=Path("tenants.yaml"), tenants=(*tenants.values(),))
    )
    return tenants


def _sweep(harness) -> None:
    """One monitor sweep, and the launches it handed to the pool, done."""
    harness.orchestrator.sweep()
    deadline = time.monotonic() + 60
    while any(harness.orchestrator.stages.launching(r.id) for r in harness.orchestrator.ledger.runs.all()):
        assert time.monotonic() < deadline, "a launch did not finish"
        time.sleep(0.02)


def _create(harness, name: str, priority: int = 0, caller: Tenant = OPERATOR, **top: object) -> str:
    run = harness.orchestrator.create_run(run_config(name=name, **top), run_id=name, caller=caller, priority=priority)
    time.sleep(0.002)  # arrival is the queue's second key: one run per millisecond
    return run.id


def _start(harness, name: str, priority: int = 0, caller: Tenant = OPERATOR, **top: object) -> str:
    run_id = _create(harness, name, priority, caller, **top)
    _sweep(harness)
    assert harness.run(run_id).state == RUNNING, harness.run(run_id).error
    return run_id


def _explorers(harness, run_id: str) -> set[str]:
    run = harness.run(run_id)
    return {i for i, role in run.assignments.items() if role == "explorer" and i not in run.leaving}


def _logs(harness, run_id: str) -> list[str]:
    return [message for kind, message in harness.events(run_id) if kind == "log"]


# ---- the queue ----------------------------------------------------------------------------------------------------


def test_pending_runs_start_by_priority_then_arrival_and_say_once_why_they_wait(harness, unique):
    low = _create(harness, f"{unique}-low")
    first = _create(harness, f"{unique}-first", priority=5)
    second = _create(harness, f"{unique}-second", priority=5)

    started = []
    for _ in range(3):
        _sweep(harness)
        _sweep(harness)  # a second look changes nothing
        running = [r for r in (low, first, second) if harness.run(r).state == RUNNING]
        assert len(running) == 1
        started.append(running[0])
        harness.orchestrator.cancel(running[0])
    assert started == [first, second, low]
    assert _logs(harness, low).count("waiting for free services (1 explorer, 1 trainer)") == 1
    assert [r.queued_unix_ms for r in map(harness.run, (low, first, second))] == sorted(
        r.created_unix_ms for r in map(harness.run, (low, first, second))
    )


def test_a_waiting_run_holds_back_what_it_needs_and_lower_runs_start_with_the_rest(
    harness, add_service, add_explorer, unique
):
    busy = harness.launch(f"{unique}-busy")  # the one trainer and the one explorer
    spare = add_explorer()
    add_service("trainer")
    add_service("trainer")
    high = _create(harness, f"{unique}-high", priority=10, explorer={"num_workers": 2})
    behind = _create(harness, f"{unique}-behind", mode="explore")
    backfill = _create(harness, f"{unique}-backfill", **TRAIN_ONLY)

    _sweep(harness)
    _sweep(harness)

    assert [harness.run(r).state for r in (high, behind, backfill)] == [PENDING, PENDING, RUNNING]
    assert spare.starts == []  # held for `high`, not given to `behind`
    assert _logs(harness, high).count("waiting for free services (1 explorer)") == 1
    assert _logs(harness, behind).count(f"queued behind run {high}") == 1

    harness.orchestrator.cancel(busy)
    _sweep(harness)
    assert harness.run(high).state == RUNNING and _explorers(harness, high) == {
        harness.explorer.instance_id,
        spare.instance_id,
    }
    assert harness.run(behind).state == PENDING


def test_a_tenants_run_waits_while_its_explorers_quota_is_in_use_without_holding_anything_back(
    harness, add_service, add_explorer, unique
):
    alice = _tenants(harness, alice=Quotas(explorers=1))["alice"]
    first = _start(harness, f"{unique}-a1", caller=alice)
    add_explorer()
    add_service("trainer")
    second = _create(harness, f"{unique}-a2", priority=5, caller=alice)
    other = _create(harness, f"{unique}-op")

    _sweep(harness)
    _sweep(harness)
    assert (harness.run(second).state, harness.run(other).state) == (PENDING, RUNNING)
    assert _logs(harness, second).count("waiting: tenant alice's quota explorers=1 is in use") == 1

    harness.orchestrator.cancel(first)
    _sweep(harness)
    assert harness.run(second).state == RUNNING and harness.run(second).tenant == "alice"


def test_only_a_run_short_of_live_instances_fails_at_the_pending_timeout_not_one_waiting_its_turn(harness, unique):
    harness.launch(f"{unique}-busy")
    turn = _create(harness, f"{unique}-turn")
    short = _create(harness, f"{unique}-short", explorer={"num_workers": 3})
    _sweep(harness)

    harness.clock.advance(601)  # past the harness's assign_timeout of 600 s
    _sweep(harness)

    assert harness.run(turn).state == PENDING
    failed = harness.run(short)
    assert failed.state == gateway_pb2.RUN_STATE_FAILED
    assert failed.error == "no free services within 600s (2 explorer)"


# ---- the explorer pool --------------------------------------------------------------------------------------------


def test_two_tenants_runs_share_three_explorers_within_their_quotas(
    harness, add_service, add_explorer, address, unique
):
    tenants = _tenants(harness, alice=Quotas(explorers=2), bob=Quotas(explorers=2))
    add_explorer()
    add_explorer()
    add_service("trainer")
    runs = {name: _start(harness, f"{unique}-{name}", caller=tenant) for name, tenant in tenants.items()}
    for name, run_id in runs.items():
        harness.orchestrator.scaler.scale(run_id, 2, tenants[name])

    _sweep(harness)
    held = {name: len(_explorers(harness, run_id)) for name, run_id in runs.items()}
    assert held == {"alice": 2, "bob": 1}  # one each kept, the free one to the first of two equally placed

    with open_channel(address, token="alice") as channel, pytest.raises(grpc.RpcError) as info:
        request = gateway_pb2.ScaleRunRequest(run_id=runs["alice"], explorers=3)
        gateway_pb2_grpc.GatewayServiceStub(channel).ScaleRun(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == "tenant alice's running runs would want 3 explorers: its quota explorers=2"

    add_explorer()
    add_explorer()
    _sweep(harness)
    _sweep(harness)
    assert {name: len(_explorers(harness, run_id)) for name, run_id in runs.items()} == {"alice": 2, "bob": 2}


def test_free_explorers_go_to_the_higher_priority_run_first(harness, add_service, add_explorer, unique):
    add_service("trainer")
    low = _start(harness, f"{unique}-low")
    add_explorer()
    high = _start(harness, f"{unique}-high", priority=9)
    for run_id in (low, high):
        harness.orchestrator.scaler.scale(run_id, 3)
    add_explorer()
    add_explorer()

    _sweep(harness)
    assert (len(_explorers(harness, high)), len(_explorers(harness, low))) == (3, 1)


def _pool_of_three(harness, add_explorer, name: str, priority: int) -> tuple[str, dict[str, FakeService]]:
    """A running run of `priority` whose stage names one explorer, scaled to three and holding them."""
    fakes = {harness.explorer.instance_id: harness.explorer}
    run_id = _start(harness, name, priority)
    fakes |= {f.instance_id: f for f in (add_explorer(), add_explorer())}
    harness.orchestrator.scaler.scale(run_id, 3)
    _sweep(harness)
    assert _explorers(harness, run_id) == set(fakes)
    return run_id, fakes


def test_a_pending_run_gets_explorers_back_from_a_lower_runs_spare_once_without_thrashing(
    harness, add_service, add_explorer, unique
):
    lower, fakes = _pool_of_three(harness, add_explorer, f"{unique}-lower", priority=0)
    add_service("trainer")
    pending = _create(harness, f"{unique}-pending", priority=5, explorer={"num_workers": 2})

    _sweep(harness)
    _sweep(harness)  # those asked are on their way: nobody else is asked

    leavers = sorted(harness.run(lower).leaving)
    assert len(leavers) == 2 and harness.run(pending).state == PENDING
    for instance_id, fake in fakes.items():
        assert fake.stop_reasons() == (["STOP_REASON_SCALED_DOWN"] if instance_id in leavers else [])
        assert [s.detail for s in fake.stops] == ([f"making room for run {pending}"] if instance_id in leavers else [])
    assert _logs(harness, pending).count("waiting for explorers that other runs give back") == 1

    for instance_id in leavers:
        harness.report(lower, fakes[instance_id], gateway_pb2.EVENT_KIND_LEAVING, message="explorer leaving")
    _sweep(harness)
    _sweep(harness)

    assert harness.run(pending).state == RUNNING and _explorers(harness, pending) == set(leavers)
    run = harness.run(lower)
    assert run.state == RUNNING and run.explorers == 3 and len(_explorers(harness, lower)) == 1  # its minimum
    assert sum(len(f.starts) for f in fakes.values()) == 3 + 2  # no explorer went back and forth


def test_a_higher_runs_spare_is_not_taken_for_a_lower_pending_run(harness, add_service, add_explorer, unique):
    higher, fakes = _pool_of_three(harness, add_explorer, f"{unique}-higher", priority=9)
    add_service("trainer")
    pending = _create(harness, f"{unique}-pending", priority=5, explorer={"num_workers": 2})

    _sweep(harness)

    assert not harness.run(higher).leaving and all(f.stops == [] for f in fakes.values())
    assert _logs(harness, pending) == ["waiting for free services (2 explorer)"]
