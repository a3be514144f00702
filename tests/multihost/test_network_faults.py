"""Network faults between test hosts (issue 33, item 2): a tiny run over three hosts (control plane: Redis, gateway,
buffer; trainer; explorer) while its links fail. A 30 s partition between the trainer's host and the control host;
a 30 s partition of the explorer's host from everything; a whole run with every gRPC and Redis link through a fault
proxy that delays each chunk 200 ms each way and resets connections. Each run succeeds, bounded, with the accounting
balanced; the seconds from heal to the next train step and the accounting are printed, and merged into the JSON file
TRINITY_NETWORK_FAULTS_OUT names when it is set (benchmarks/results/network_faults.json came from that variable set
to it, `pytest -s -m system tests/multihost/test_network_faults.py`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import tiny_config
from tests.e2e.faults import Watcher, assert_balanced
from tests.multihost import packet_filter
from tests.multihost.fault_proxy import FaultProxy, Faults
from tests.multihost.netns import HostNetwork, NetnsHost
from tests.multihost.packet_filter import detour, partitioned
from tests.multihost.stack import PORTS, REDIS_PORT, REDIS_URL, start_redis, start_service
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(packet_filter.unavailable_reason() is not None, reason=str(packet_filter.unavailable_reason())),
]

OUT = os.environ.get("TRINITY_NETWORK_FAULTS_OUT", "")
STEPS = 5  # a partitioned run: one step before the partition, the rest after the heal
PROXY_STEPS = 2  # through the proxy each step takes some 12 s (every Redis command and gRPC call 0.4 s more)
PARTITION_S = 30.0
WAIT_S = 240.0  # any one wait of a test: far past a healed run's, short of CI's patience
# The gateway declares a silent instance lost after this (default 30 s): shorter than the partition, so each
# partition takes the recovery path (work handed back, the same instance started again when it is heard again)
# rather than depending on which side of 30 s the silence ends.
LIVENESS_S = "10"


def _config(model: Path, checkpoint_dir: Path, steps: int) -> dict:
    return tiny_config(
        model,
        **{
            "buffer.total_steps": steps,
            "buffer.eval_tasksets": [],
            "explorer.eval_interval": 1000,
            # Tasks leased by an explorer that was cut off come back after this, sooner than the partition ends.
            # (`synchronizer.timeout_seconds` stays at 60 s: an explorer cut off while it waited for weights is
            # held up to that long by the sync store's dead connection before it joins the next generation.)
            "buffer.taskset.lease_seconds": 15,
            "checkpoint_dir": str(checkpoint_dir),
        },
    )


def _start(net: HostNetwork, log_dir: Path, *, redis_url: str = REDIS_URL, redis_on_network: bool = False) -> str:
    """Redis, gateway and buffer on `control`, the trainer and the explorer on hosts of their own; the gateway's
    address."""
    control, trainer, explorer = (net.hosts[label] for label in ("control", "trainer", "explorer"))
    start_redis(control, log_dir, on_network=redis_on_network)
    gateway = f"{control.address}:{PORTS['gateway']}"
    start_service(control, "gateway", log_dir, {"TRINITY_REDIS_URL": redis_url, "TRINITY_LIVENESS_SECONDS": LIVENESS_S})
    start_service(control, "buffer", log_dir, {"TRINITY_REDIS_URL": redis_url, "TRINITY_GATEWAY": gateway})
    start_service(trainer, "trainer", log_dir, {"TRINITY_GATEWAY": gateway})
    start_service(explorer, "explorer", log_dir, {"TRINITY_GATEWAY": gateway})
    return gateway


def _logs(log_dir: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(log_dir.glob("*.log")))


def _first_train_step_after(watcher: Watcher, unix_ms: int) -> float:
    """Seconds from `unix_ms` until the gateway recorded the next train step (the run trains again)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        later = [e.unix_ms for e in watcher.trained() if e.unix_ms >= unix_ms]
        if later:
            return (min(later) - unix_ms) / 1000
        if watcher.ended:
            break
        time.sleep(0.2)
    lines = "\n".join(f"{e.source}: {e.message}" for e in watcher.events if e.message)
    raise AssertionError(f"no train step within {WAIT_S:.0f}s of the heal (run ended: {watcher.ended}):\n{lines}")


def _since(run: gateway_pb2.Run, events: list[gateway_pb2.RunEvent]) -> list[float]:
    """Seconds from the run's creation to each of `events`, as the gateway recorded them."""
    return [round((e.unix_ms - run.created_unix_ms) / 1000, 1) for e in events]


def _gateway_said(events: list[gateway_pb2.RunEvent], since_ms: int) -> list[str]:
    """What the gateway noted about the run from `since_ms` on (losses, replacements, sync generations)."""
    return [e.message for e in events if e.source == "gateway" and e.message and e.unix_ms >= since_ms]


def _record(fault: str, result: dict[str, object]) -> None:
    """Print the fault's result and, with OUT set, merge it into that file, keyed by fault (each test its own entry)."""
    print(f"{fault}:", json.dumps(result))
    if not OUT:
        return
    out = Path(OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    results[fault] = result
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def _partition_run(
    net: HostNetwork, model: Path, tmp_path: Path, side: list[NetnsHost], other: list[NetnsHost], *, isolate: bool
) -> dict[str, object]:
    """A run partitioned once, after its first train step, for PARTITION_S; what it measured."""
    logs, checkpoint_dir = tmp_path / "logs", tmp_path / "ckpt"
    logs.mkdir()
    gateway = _start(net, logs)
    with TrinityClient(gateway) as client:
        run = client.create_run(_config(model, checkpoint_dir, STEPS))
        started = time.monotonic()
        watcher = Watcher(run)
        watcher.next_train_step()
        cut = time.time_ns() // 1_000_000
        with partitioned(side, other, isolate=isolate):
            time.sleep(PARTITION_S)
        healed = time.time_ns() // 1_000_000
        recovery = _first_train_step_after(watcher, healed)
        final = run.wait(timeout=WAIT_S)
        events = watcher.join()
    assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error + _logs(logs)
    trained = [e for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
    assert [e.step for e in trained] == list(range(1, STEPS + 1))
    versions = [e.model_version for e in trained]
    assert versions == sorted(set(versions))
    accounting = assert_balanced(f"{net.hosts['control'].address}:{PORTS['buffer']}", run.id, checkpoint_dir, STEPS)
    return {
        "outcome": "SUCCEEDED",
        "steps": STEPS,
        "run_s": round(time.monotonic() - started, 1),
        "partition_s": PARTITION_S,
        "partition_at_s": round((cut - final.created_unix_ms) / 1000, 1),
        "train_steps_recorded_during_partition": sum(cut <= e.unix_ms < healed for e in trained),
        "recovery_s": round(recovery, 1),
        "train_steps_at_s": _since(final, trained),
        "accounting": accounting,
        "gateway_said": _gateway_said(events, since_ms=cut),
    }


def test_a_run_heals_after_a_30s_partition_between_the_trainer_and_the_control_host(network, tiny_model, tmp_path):
    net = network(["control", "trainer", "explorer"])
    side, other = [net.hosts["trainer"]], [net.hosts["control"]]
    _record("partition trainer | control 30s", _partition_run(net, tiny_model, tmp_path, side, other, isolate=False))


def test_a_run_heals_after_a_30s_partition_of_the_explorer_from_everything(network, tiny_model, tmp_path):
    net = network(["control", "trainer", "explorer"])
    side, other = [net.hosts["explorer"]], [net.hosts["control"], net.hosts["trainer"]]
    _record("partition explorer | all 30s", _partition_run(net, tiny_model, tmp_path, side, other, isolate=True))


DELAY_S = 0.2
DROP_EVERY_S = 8.0


def test_a_run_succeeds_with_every_grpc_and_redis_link_slow_and_dropping(network, tiny_model, tmp_path):
    net = network(["control", "trainer", "explorer"])
    control, trainer, explorer = (net.hosts[label] for label in ("control", "trainer", "explorer"))
    endpoints = {
        "redis": (control.address, REDIS_PORT),
        "gateway": (control.address, PORTS["gateway"]),
        "buffer": (control.address, PORTS["buffer"]),
        "trainer": (trainer.address, PORTS["trainer"]),
        "explorer": (explorer.address, PORTS["explorer"]),
    }
    logs, checkpoint_dir = tmp_path / "logs", tmp_path / "ckpt"
    logs.mkdir()
    with FaultProxy(Faults(delay_s=DELAY_S, drop_every_s=DROP_EVERY_S, seed=0)) as proxy:
        # The proxy listens on the bridge (the root namespace), so every link leaves its host; each host's own
        # connections to a service, the control host's to itself included, are rewritten to reach it.
        via = {
            target: (net.bridge_address, proxy.add_link(name, target, (net.bridge_address, 0)))
            for name, target in endpoints.items()
        }
        for host in net.hosts.values():
            detour(host, via)
        redis_url = f"redis://{control.address}:{REDIS_PORT}/0"
        began = time.monotonic()
        _start(net, logs, redis_url=redis_url, redis_on_network=True)
        start_s, started = time.monotonic() - began, time.monotonic()
        # The test's own client goes through the proxy too: the SDK's link to the gateway.
        with TrinityClient("{}:{}".format(*via[endpoints["gateway"]])) as client:
            run = client.create_run(_config(tiny_model, checkpoint_dir, PROXY_STEPS))
            watcher = Watcher(run)
            final = run.wait(timeout=WAIT_S)
            events = watcher.join()
            # One run, although gRPC retried CreateRun calls whose connection the proxy reset (request ids).
            assert [r.id for r in client.list_runs()] == [run.id]
        run_s = time.monotonic() - started
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error + _logs(logs)
        trained = [e for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
        assert [e.step for e in trained] == list(range(1, PROXY_STEPS + 1))
        assert [e.model_version for e in trained] == sorted({e.model_version for e in trained})
        accounting = assert_balanced(f"{control.address}:{PORTS['buffer']}", run.id, checkpoint_dir, PROXY_STEPS)
        counts = proxy.counts()
    # The faults happened: every link carried traffic through the proxy, and the links held open all run long (the
    # services' channels and Redis pools) had connections reset under them. The gateway opens a channel per call to
    # a trainer or an explorer (StartRun, StopRun): those links are crossed by a few short connections only.
    assert all(c.connections > 0 and c.bytes_to_target > 0 and c.bytes_from_target > 0 for c in counts.values()), counts
    assert all(counts[name].drops > 0 for name in ("redis", "gateway", "buffer")), counts
    _record(
        "proxy 200ms each way + resets",
        {
            "outcome": "SUCCEEDED",
            "steps": PROXY_STEPS,
            "services_start_s": round(start_s, 1),
            "run_s": round(run_s, 1),
            "delay_s": DELAY_S,
            "drop_every_s": DROP_EVERY_S,
            "train_steps_at_s": _since(final, trained),
            "links": {name: c.as_dict() for name, c in counts.items()},
            # Reads whose reply the proxy cut off: the trainer handed their entries back (trinity.trainer.runner).
            "trainer_deliveries_lost": (logs / "trainer-trainer.log").read_text().count('"trainer.deliveries_lost"'),
            "accounting": accounting,
            "gateway_said": _gateway_said(events, since_ms=0),
        },
    )
