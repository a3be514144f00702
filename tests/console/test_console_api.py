"""The console's HTTP API (docs/console.md) over a real gateway and buffer: no run needs services to start here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.conftest import ServiceProcess
from tests.console.conftest import EXAMPLES
from trinity.clients import BufferClient, GatewayClient
from trinity.config import StreamConfig, naming
from trinity.config.errors import ConfigError
from trinity.config.run import parse_run_config
from trinity.console import configs, runs
from trinity.console.app import create_app
from trinity.console.settings import ConsoleSettings
from trinity.v1 import common_pb2, gateway_pb2

QUICKSTART = (EXAMPLES / "quickstart" / "config.yaml").read_text()


def _quickstart(**changes: Any) -> str:
    """The quickstart config with its data paths made absolute (a config sent as text has no file to be beside)."""
    config = yaml.safe_load(QUICKSTART)
    for section in (config["buffer"]["taskset"], *config["buffer"]["eval_tasksets"]):
        section["path"] = str(EXAMPLES / "quickstart" / section["path"])
    config.update(changes)
    return yaml.safe_dump(config)


@pytest.fixture
def pending_run(console: TestClient, unique: str) -> Iterator[str]:
    """A run the gateway accepted; with no explorer or trainer registered it stays PENDING."""
    reply = console.post("/api/runs", json={"yaml": _quickstart(name=unique)})
    assert reply.status_code == 200, reply.text
    run_id = reply.json()["run_id"]
    yield run_id
    console.post(f"/api/runs/{run_id}/cancel")


def _sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]


def test_schema_lists_the_registries_the_config_validates_against(console):
    body = console.get("/api/schema").json()
    assert "grpo" in body["registries"]["algorithm"] and "math" in body["registries"]["workflow"]
    assert "accuracy" in body["registries"]["reward"] and "reward_filter" in body["registries"]["operator"]
    assert {"policy_loss", "advantage"} <= set(body["registries"])
    assert "buffer" in body["schema"]["properties"]


def test_schema_examples_validate_as_sent(console):
    examples = {e["name"]: e["yaml"] for e in console.get("/api/schema").json()["examples"]}
    assert "quickstart" in examples
    reply = console.post("/api/validate", json={"yaml": examples["quickstart"]}).json()
    assert reply["ok"], reply["errors"]
    assert reply["config"]["buffer"]["taskset"]["path"] == str(EXAMPLES / "quickstart" / "train.jsonl")


def test_validate_returns_the_clis_message_for_a_bad_field(console):
    text = QUICKSTART.replace("batch_size: 8", "batch_size: 0")
    with pytest.raises(ConfigError) as cli:  # what `trinity run` prints after "trinity: invalid input"
        parse_run_config(text)
    reply = console.post("/api/validate", json={"yaml": text}).json()
    assert reply["ok"] is False and reply["config"] is None
    assert [f"{e['field']}: {e['message']}" for e in reply["errors"]] == str(cli.value).splitlines()
    assert reply["errors"][0]["field"] == "buffer.batch_size"


def test_validate_normalizes_a_good_config(console):
    reply = console.post("/api/validate", json={"yaml": QUICKSTART}).json()
    assert reply["ok"] and reply["errors"] == []
    assert reply["config"]["algorithm"]["algorithm_type"] == "grpo"
    assert reply["config"]["explorer"]["top_p"] == 1.0  # a default the file does not set


def test_launch_refuses_a_bad_config_naming_the_field(console):
    reply = console.post("/api/runs", json={"yaml": QUICKSTART.replace("grpo", "grpoo")})
    assert reply.status_code == 400
    assert reply.json()["errors"][0]["field"] == "algorithm.algorithm_type"


def test_a_launched_run_is_listed_and_shown_with_its_config(console, pending_run):
    listed = {r["id"]: r for r in console.get("/api/runs").json()["runs"]}
    assert listed[pending_run]["state"] == "PENDING" and listed[pending_run]["mode"] == "both"
    run = console.get(f"/api/runs/{pending_run}").json()
    assert yaml.safe_load(run["config_yaml"])["buffer"]["batch_size"] == 8
    assert run["accounting"] == {"put": 0, "delivered": 0, "acked": 0, "pending": 0, "dropped": {}}
    assert [s["role"] for s in run["services"]] == ["buffer"]


def test_cancel_ends_the_run(console, pending_run):
    reply = console.post(f"/api/runs/{pending_run}/cancel")
    assert reply.status_code == 200 and reply.json()["state"] == "CANCELLED"
    assert console.get(f"/api/runs/{pending_run}").json()["state"] == "CANCELLED"


def test_an_unknown_run_is_404(console):
    assert console.get("/api/runs/no-such-run").status_code == 404
    assert console.get("/api/runs/no-such-run/events").status_code == 404


def test_events_replay_the_run_log_and_end_with_the_run(console, pending_run):
    console.post(f"/api/runs/{pending_run}/cancel")
    reply = console.get(f"/api/runs/{pending_run}/events")
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(reply.text)
    # (The gateway may also have logged why the run waited, if its monitor looked at it before the cancel.)
    states = [(e["kind"], e["state"]) for e in events if e["kind"] == "state"]
    assert states == [("state", "PENDING"), ("state", "CANCELLED")] and events[-1]["state"] == "CANCELLED"
    resumed = _sse_events(console.get(f"/api/runs/{pending_run}/events", params={"after": events[0]["seq"]}).text)
    assert [e["seq"] for e in resumed] == [e["seq"] for e in events[1:]]


def test_spans_come_as_the_timeline_draws_them_from_a_step_on(console, pending_run, stack):
    event = gateway_pb2.RunEvent(run_id=pending_run, kind=gateway_pb2.EVENT_KIND_TRAIN, source="trainer/t", step=2)
    for step, start in ((1, 100), (2, 200)):
        event.spans.add(phase=gateway_pb2.PHASE_OPTIMIZER, step=step, start_unix_ms=start, end_unix_ms=start + 5)
    with GatewayClient(stack.address) as gateway:
        gateway.report(event)
    reply = console.get(f"/api/runs/{pending_run}/spans", params={"since_step": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["spans"] == [
        {
            "phase": "optimizer",
            "source": "trainer/t",
            "stage": 0,
            "step": 2,
            "model_version": 0,
            "start_unix_ms": 200,
            "end_unix_ms": 205,
            "detail": "",
        }
    ]
    assert console.get("/api/runs/nope/spans").status_code == 404


def test_experiences_are_sampled_newest_first_and_filtered(console, pending_run, stack):
    stream = naming.experience_stream(pending_run, 0)
    address = next(s["address"] for s in console.get(f"/api/runs/{pending_run}").json()["services"])
    with BufferClient(address) as buffer:
        buffer.create_stream(StreamConfig(name=stream))
        buffer.put(
            stream,
            [
                common_pb2.Experience(
                    id=f"{pending_run}-{i}",
                    run_id=pending_run,
                    group_id=f"g{i // 2}",
                    prompt_text=f"What is {i}+1?",
                    response_text=str(i + 1),
                    reward=float(i % 2),
                    reward_components={"accuracy": float(i % 2)},
                    model_version=i // 2,
                    response_token_ids=[1, 2],
                    logprobs=[0.0, 0.0],
                )
                for i in range(6)
            ],
        )
        url = f"/api/runs/{pending_run}/experiences"
        every = console.get(url).json()["experiences"]
        assert [e["id"] for e in every] == [f"{pending_run}-{i}" for i in reversed(range(6))]
        assert every[0]["prompt"] == "What is 5+1?" and every[0]["components"] == {"accuracy": 1.0}
        assert every[0]["advantage"] is None
        rewarded = console.get(url, params={"min_reward": 0.5, "version": 1}).json()["experiences"]
        assert [e["id"] for e in rewarded] == [f"{pending_run}-3"]
        assert len(console.get(url, params={"limit": 2}).json()["experiences"]) == 2
        assert buffer.stream(stream).stats.delivered == 0  # looked at, never consumed


def test_experiences_limit_out_of_bounds_is_400_naming_it(console, pending_run):
    reply = console.get(f"/api/runs/{pending_run}/experiences", params={"limit": 0})
    assert reply.status_code == 400 and reply.json()["errors"][0]["field"] == "limit"


def test_steer_out_of_bounds_is_400_naming_the_knob(console, pending_run):
    reply = console.post(f"/api/runs/{pending_run}/steer", json={"temperature": 2.5})
    assert reply.status_code == 400
    assert reply.json()["errors"][0]["field"] == "temperature"
    reply = console.post(f"/api/runs/{pending_run}/steer", json={"learning_rate": 0})
    assert reply.status_code == 400 and reply.json()["errors"][0]["field"] == "learning_rate"


def test_steer_with_no_knob_is_400(console, pending_run):
    reply = console.post(f"/api/runs/{pending_run}/steer", json={})
    assert reply.status_code == 400 and reply.json()["errors"][0]["field"] == "steering"


def test_steer_an_unknown_knob_is_400(console, pending_run):
    reply = console.post(f"/api/runs/{pending_run}/steer", json={"batch_size": 4})
    assert reply.status_code == 400 and reply.json()["errors"] == [{"field": "batch_size", "message": "unknown field"}]


def test_steering_a_run_that_is_not_running_is_409(console, pending_run):
    reply = console.post(f"/api/runs/{pending_run}/steer", json={"temperature": 0.5})
    assert reply.status_code == 409 and "PENDING" in reply.json()["detail"]


def test_steering_an_unknown_run_is_404(console):
    assert console.post("/api/runs/no-such-run/steer", json={"temperature": 0.5}).status_code == 404


def _launch(console: TestClient, name: str) -> str:
    reply = console.post("/api/runs", json={"yaml": _quickstart(name=name)})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["run_id"])


@pytest.fixture
def two_pending(console: TestClient, unique: str) -> Iterator[tuple[str, str]]:
    first, second = _launch(console, f"{unique}-a"), _launch(console, f"{unique}-b")
    yield first, second
    for run_id in (first, second):
        console.post(f"/api/runs/{run_id}/cancel")


def _listed(console: TestClient) -> dict[str, dict]:
    return {r["id"]: r for r in console.get("/api/runs").json()["runs"]}


def test_a_paused_run_leaves_the_queue_and_a_resumed_one_joins_its_end(console, two_pending):
    first, second = two_pending
    listed = _listed(console)
    assert listed[first]["queue_position"] < listed[second]["queue_position"]
    assert (listed[first]["priority"], listed[first]["tenant"]) == (0, "")

    reply = console.post(f"/api/runs/{first}/pause", json={"reason": "make room"})
    assert reply.status_code == 200, reply.text
    assert (reply.json()["state"], reply.json()["pausing"]) == ("PAUSED", False)  # nothing was assigned to stop
    assert console.post(f"/api/runs/{first}/pause").status_code == 200  # no body, and paused already: a no-op
    listed = _listed(console)
    assert listed[first]["state"] == "PAUSED" and listed[first]["queue_position"] is None

    reply = console.post(f"/api/runs/{first}/resume")
    assert reply.status_code == 200, reply.text
    resumed = reply.json()
    assert resumed["state"] == "PENDING" and resumed["queued_unix_ms"] >= listed[second]["queued_unix_ms"]
    listed = _listed(console)
    assert listed[second]["queue_position"] < listed[first]["queue_position"]


def test_the_run_shows_the_explorers_it_wants_and_has(console, pending_run):
    reply = console.get(f"/api/runs/{pending_run}")
    assert reply.status_code == 200, reply.text
    run = reply.json()
    assert run["explorers"] == {"wanted": 1, "active": [], "leaving": []}  # the quickstart's explorer.num_workers
    assert run["pausing"] is False


def test_scale_pause_and_resume_refusals(console, pending_run):
    run_id = pending_run
    reply = console.post(f"/api/runs/{run_id}/scale", json={"explorers": 2})
    assert reply.status_code == 409 and "only a RUNNING run can be scaled" in reply.json()["detail"]
    reply = console.post(f"/api/runs/{run_id}/resume")
    assert reply.status_code == 409 and "only a paused run resumes" in reply.json()["detail"]
    console.post(f"/api/runs/{run_id}/cancel")
    reply = console.post(f"/api/runs/{run_id}/pause")
    assert reply.status_code == 409 and "CANCELLED" in reply.json()["detail"]


@pytest.mark.parametrize("explorers", [0, "two", 2**40])
def test_a_bad_explorer_count_is_400_naming_the_field(console, pending_run, explorers):
    reply = console.post(f"/api/runs/{pending_run}/scale", json={"explorers": explorers})
    assert reply.status_code == 400, reply.text
    assert [e["field"] for e in reply.json()["errors"]] == ["explorers"]


def test_unknown_fields_and_runs_are_refused(console):
    assert console.post("/api/runs/no-such-run/scale", json={"explorers": 2}).status_code == 404
    assert console.post("/api/runs/no-such-run/pause").status_code == 404
    assert console.post("/api/runs/no-such-run/resume").status_code == 404
    reply = console.post("/api/runs/no-such-run/pause", json={"until": "later"})
    assert reply.status_code == 400 and reply.json()["errors"] == [{"field": "until", "message": "unknown field"}]


def _run(
    run_id: str, state: int = gateway_pb2.RUN_STATE_PENDING, created_unix_ms: int = 1, **fields
) -> gateway_pb2.Run:
    return gateway_pb2.Run(id=run_id, state=state, created_unix_ms=created_unix_ms, **fields)


def test_the_queue_is_in_start_order_priority_first():
    found = [
        _run("late", queued_unix_ms=30),
        _run("early", queued_unix_ms=10),
        _run("urgent", queued_unix_ms=40, priority=5),
        _run("running", priority=9, state=gateway_pb2.RUN_STATE_RUNNING),
        _run("old", created_unix_ms=20),  # recorded before the gateway kept queued_unix_ms
    ]
    assert [r.id for r in runs.queue(found)] == ["urgent", "early", "old", "late"]


def test_explorers_leaving_are_told_apart_from_active_ones():
    config, problems = configs.validate(_quickstart())
    assert config is not None, problems
    run = _run(
        "r",
        config_json=config.model_dump_json(),
        explorers=1,
        assignments={"e1": "explorer", "e2": "explorer", "t1": "trainer"},
        leaving=["e2"],
    )
    assert runs.explorers(run) == {"wanted": 1, "active": ["e1"], "leaving": ["e2"]}


def test_health_says_whether_the_gateway_answers(console, stack):
    assert console.get("/health").json() == {"status": "ok", "gateway": True}
    with TestClient(create_app(ConsoleSettings(gateway="127.0.0.1:1"))) as lonely:
        assert lonely.get("/health").json() == {"status": "ok", "gateway": False}


@pytest.fixture
def guarded(stack) -> Iterator[TestClient]:
    with TestClient(create_app(ConsoleSettings(gateway=stack.address, token="s3cret"))) as client:
        yield client


def test_with_a_token_the_api_refuses_requests_without_it(guarded):
    assert guarded.get("/api/runs").status_code == 401
    assert guarded.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert guarded.get("/health").status_code == 200  # the page and its health load, to show the login


def test_login_sets_the_cookie_the_page_then_sends(guarded):
    assert guarded.post("/api/login", json={"token": "wrong"}).status_code == 401
    assert guarded.post("/api/login", json={"token": "s3cret"}).status_code == 200
    assert guarded.post("/api/validate", json={"yaml": QUICKSTART}).status_code == 200  # the cookie rides along


def test_a_tenants_console_answers_429_past_a_quota_and_403_for_another_tenants_run(redis_server, tmp_path, unique):
    """A console run by a tenant (its token): the gateway's refusals come through as HTTP statuses, not 502."""
    operator, alice = "operator-token", "alice-token"
    tenants = tmp_path / "tenants.yaml"
    digest = hashlib.sha256(alice.encode()).hexdigest()
    tenants.write_text(yaml.safe_dump({"tenants": [{"name": "alice", "token_sha256": digest, "quotas": {"runs": 1}}]}))
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_AUTH_TOKEN": operator, "TRINITY_TENANTS_FILE": str(tenants)}
    gateway = ServiceProcess("gateway", env=env).start()
    try:
        with GatewayClient(gateway.address, token=operator) as client:
            theirs = client.create_run(_quickstart(name=f"{unique}-op"))
        settings = ConsoleSettings(gateway=gateway.address, token=alice, examples_dir=EXAMPLES)
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {alice}"}) as console:
            first = console.post("/api/runs", json={"yaml": _quickstart(name=unique)})
            assert first.status_code == 200, first.text
            second = console.post("/api/runs", json={"yaml": _quickstart(name=f"{unique}-2")})
            assert second.status_code == 429 and "quota runs=1" in second.json()["detail"], second.text
            other = console.get(f"/api/runs/{theirs.id}")
            assert other.status_code == 403 and "not a run of tenant alice" in other.json()["detail"], other.text
            assert [r["id"] for r in console.get("/api/runs").json()["runs"]] == [first.json()["run_id"]]
            console.post(f"/api/runs/{first.json()['run_id']}/cancel")
        with GatewayClient(gateway.address, token=operator) as client:
            client.cancel_run(theirs.id)
    finally:
        gateway.stop()
