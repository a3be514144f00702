"""The trackers sink against a real gateway: a run submitted to the gateway (not `trinity run`), its events reported
as the services report them, lands in TensorBoard, MLflow (a file store) and W&B (offline) at its train steps; a
restarted sink writes no point twice; a tracker that fails is reported once and the run goes on."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.conftest import ServiceProcess
from tests.trackers.wandb_files import read_runs, series
from trinity.clients.gateway import GatewayClient
from trinity.gateway.runs import RunStore
from trinity.runtime.redis_server import RedisServer, start_redis_server
from trinity.sdk import TrinityClient
from trinity.trackers.sink import TrackerSink
from trinity.trackers.trackers import CURSOR_FILE
from trinity.v1 import gateway_pb2

pytestmark = pytest.mark.system  # a gateway, Redis and the sink with MLflow and W&B: make test-system

TRAIN, EXPLORE, EVAL = gateway_pb2.EVENT_KIND_TRAIN, gateway_pb2.EVENT_KIND_EXPLORE, gateway_pb2.EVENT_KIND_EVAL


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """Not the session's: runs here have no services, and a gateway there might hand them to another test's."""
    server = start_redis_server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(own_redis) -> Iterator[ServiceProcess]:
    service = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": own_redis.url}).start()
    yield service
    service.stop()


@pytest.fixture(autouse=True)
def no_other_runs(own_redis) -> None:
    """Each test starts on an empty gateway (its state is all in Redis): a sink writes every run the gateway holds."""
    client = redis.Redis.from_url(own_redis.url)
    client.flushdb()
    client.close()


@pytest.fixture
def sinks(gateway, tmp_path) -> Iterator[Callable[[], TrackerSink]]:
    """Sinks on the gateway writing under tmp_path/trackers; each is stopped (drained) at the end if still running."""
    started: list[TrackerSink] = []
    clients: list[GatewayClient] = []

    def start() -> TrackerSink:
        clients.append(GatewayClient(gateway.address, timeout=10))
        started.append(TrackerSink(clients[-1], tmp_path / "trackers", poll_seconds=0.1).start())
        return started[-1]

    yield start
    for sink in started:
        if sink._thread.is_alive():
            sink.stop()
    for client in clients:
        client.close()


def _submit(gateway: ServiceProcess, run_id: str, **monitor: Any) -> None:
    config = {
        "name": "tracked",
        "model": {"path": "unused"},
        "buffer": {"total_steps": 4, "taskset": {"path": "unused.jsonl"}},
        "monitor": {"tensorboard": False, **monitor},
    }
    with TrinityClient(gateway.address) as client:
        client.create_run(config, run_id=run_id)


def _report(gateway: ServiceProcess, run_id: str, *events: tuple[int, int, int, dict[str, float]]) -> str:
    """(kind, step, model_version, metrics) of each, reported as a service reports it; the last one's seq."""
    seq = ""
    with GatewayClient(gateway.address) as client:
        for kind, step, version, metrics in events:
            event = gateway_pb2.RunEvent(
                run_id=run_id, kind=kind, source="trainer/t", step=step, model_version=version, metrics=metrics
            )
            reply = client.report(event)
            assert reply.run_active
            seq = reply.seq
    return seq


def _finish(redis_server: RedisServer, run_id: str, final_model_path: str = "/data/runs/x/final") -> None:
    """End the run as the gateway's ledger does when its services finish (there are none here)."""
    store = RunStore(redis.Redis.from_url(redis_server.url), redis.asyncio.Redis.from_url(redis_server.url))
    run = store.get(run_id)
    run.state, run.final_model_path = gateway_pb2.RUN_STATE_SUCCEEDED, final_model_path
    store.save(run)
    store.append_event(gateway_pb2.RunEvent(run_id=run_id, kind=gateway_pb2.EVENT_KIND_STATE, state=run.state))
    store.client.close()


def _eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


def _mlflow(root: Path, run_id: str) -> tuple[Any, Any]:
    import os

    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # as the sink sets it: MLflow 3 opens a file store only when told
    client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("trinity")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`trinity.run_id` = '{run_id}'")
    return client, run


def _steps(client: Any, run: Any, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def _tensorboard(directory: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    events.Reload()
    return [(e.step, round(float(tensor_util.make_ndarray(e.tensor_proto)), 6)) for e in events.Tensors(tag)]  # f32


def test_a_submitted_run_lands_in_every_tracker_at_its_train_steps(gateway, own_redis, sinks, unique, tmp_path):
    root = tmp_path / "trackers"
    _submit(gateway, unique, tensorboard=True, mlflow=True, wandb=True)
    sink = sinks()
    # Explore steps run ahead of train steps; eval at version v evaluates the weights after train step v.
    _report(
        gateway,
        unique,
        (EVAL, 0, 0, {"accuracy": 0.1, "accuracy/heldout": 0.1}),
        (EXPLORE, 1, 0, {"reward_mean": 0.2}),
        (EXPLORE, 2, 1, {"reward_mean": 0.3}),
        (TRAIN, 1, 1, {"loss/total": 1.0}),
        (EXPLORE, 3, 2, {"reward_mean": 0.4}),
        (TRAIN, 2, 2, {"loss/total": 0.5}),
        (EVAL, 2, 2, {"accuracy": 0.6}),
    )
    _finish(own_redis, unique)
    _eventually(lambda: unique in sink.written)

    client, run = _mlflow(root, unique)
    assert _steps(client, run, "train/loss.total") == [(1, 1.0), (2, 0.5)]  # MLflow's name (mlflow_key)
    assert _steps(client, run, "explore/reward_mean") == [(1, 0.2), (2, 0.3), (3, 0.4)]
    assert _steps(client, run, "eval/accuracy") == [(0, 0.1), (2, 0.6)]
    assert _steps(client, run, "eval/accuracy.heldout") == [(0, 0.1)]  # beside eval/accuracy in the file store
    assert run.data.params["buffer.total_steps"] == "4" and run.data.params["model.path"] == "unused"
    assert run.info.status == "FINISHED" and run.data.tags["trinity.final_model_path"] == "/data/runs/x/final"
    summary = json.loads(Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))).read_text())
    assert summary["state"] == "RUN_STATE_SUCCEEDED" and summary["final_model_path"] == "/data/runs/x/final"

    (offline,) = read_runs(root / "wandb", unique)
    assert offline.project == "trinity" and offline.config["buffer"]["total_steps"] == 4
    assert series([offline], "train/loss/total", "train/step") == [(1, 1.0), (2, 0.5)]
    assert series([offline], "explore/reward_mean", "explore/step") == [(1, 0.2), (2, 0.3), (3, 0.4)]
    assert series([offline], "eval/accuracy", "eval/step") == [(0, 0.1), (2, 0.6)]
    assert offline.summary["trinity/final_model_path"] == "/data/runs/x/final"

    assert _tensorboard(root / "tensorboard" / unique, "train/loss/total") == [(1, 1.0), (2, 0.5)]
    assert _tensorboard(root / "tensorboard" / unique, "eval/accuracy") == [(0, 0.1), (2, 0.6)]


def test_a_restarted_sink_writes_no_point_twice(gateway, own_redis, sinks, unique, tmp_path):
    root = tmp_path / "trackers"
    _submit(gateway, unique, tensorboard=True, mlflow=True, wandb=True)
    first = sinks()
    last = _report(gateway, unique, (TRAIN, 1, 1, {"loss/total": 1.0}), (TRAIN, 2, 2, {"loss/total": 0.5}))
    follower = _eventually(lambda: first.followers.get(unique))
    _eventually(lambda: set(follower.places.values()) == {last} and len(follower.places) == 3)
    first.stop()  # mid-run: flushed and let go
    assert unique not in first.written

    _report(gateway, unique, (TRAIN, 3, 3, {"loss/total": 0.25}))
    _finish(own_redis, unique)
    second = sinks()
    _eventually(lambda: unique in second.written)

    expected = [(1, 1.0), (2, 0.5), (3, 0.25)]
    client, run = _mlflow(root, unique)
    assert _steps(client, run, "train/loss.total") == expected
    assert series(read_runs(root / "wandb", unique), "train/loss/total", "train/step") == expected
    assert _tensorboard(root / "tensorboard" / unique, "train/loss/total") == expected


def _events(gateway: ServiceProcess, run_id: str) -> list[gateway_pb2.RunEvent]:
    with GatewayClient(gateway.address) as client:
        return list(client.watch(run_id))


def test_a_failing_tracker_is_reported_once_and_the_run_goes_on(gateway, own_redis, sinks, unique, tmp_path):
    root = tmp_path / "trackers"
    root.mkdir()
    (root / "tensorboard").write_text("a file where TensorBoard needs a folder")
    _submit(gateway, unique, tensorboard=True, mlflow=True)
    first = sinks()
    _eventually(lambda: unique in first.followers and "mlflow" in first.followers[unique].places)  # after TB's
    first.stop()
    second = sinks()  # fails again: the gateway records the report once
    _eventually(lambda: unique in second.followers and "mlflow" in second.followers[unique].places)
    _report(gateway, unique, (TRAIN, 1, 1, {"loss/total": 1.0}), (TRAIN, 2, 2, {"loss/total": 0.5}))
    _finish(own_redis, unique)
    _eventually(lambda: unique in second.written)

    events = _events(gateway, unique)
    failures = [e for e in events if e.source.startswith("trackers/")]
    assert [(e.kind, e.message.split(":")[0]) for e in failures] == [
        (gateway_pb2.EVENT_KIND_LOG, "tracker tensorboard failed, the run goes on without it")
    ]
    assert not [e for e in events if e.kind == gateway_pb2.EVENT_KIND_ERROR]
    with TrinityClient(gateway.address) as client:
        assert client.run(unique).status().state == gateway_pb2.RUN_STATE_SUCCEEDED
    client, run = _mlflow(root, unique)  # the other tracker has the whole run
    assert _steps(client, run, "train/loss.total") == [(1, 1.0), (2, 0.5)]


def test_the_trackers_service_writes_a_run_that_ends_as_it_stops(gateway, own_redis, unique, tmp_path):
    """`trinity serve trackers` as compose, Kubernetes and `trinity run` start it: SIGTERM right after the run ends
    (as `trinity run` stops its stack) still writes the run to its end."""
    root = tmp_path / "trackers"
    trackers = ServiceProcess(
        "trackers", env={"TRINITY_GATEWAY": gateway.address, "TRINITY_TRACKERS_DIR": str(root)}
    ).start()
    try:
        _submit(gateway, unique, tensorboard=True)
        _report(gateway, unique, (TRAIN, 1, 1, {"loss/total": 1.0}))
        _finish(own_redis, unique)
    finally:
        assert trackers.stop() == 0, trackers.logs()
    cursor = json.loads((root / "tensorboard" / unique / CURSOR_FILE).read_text())
    assert cursor["done"] is True, trackers.logs()
    assert _tensorboard(root / "tensorboard" / unique, "train/loss/total") == [(1, 1.0)]
