"""The compose stack in real containers (`make test-containers`): a tiny-model GRPO job from the host through
the SDK to SUCCEEDED with two explorers in the sync group, one explorer killed mid-run and brought back by its
restart policy, the explorer service then scaled to three containers mid-run and the run to three explorers
(ScaleRun), and every service's own metrics scraped from its published port.

Needs a Docker engine and the images deploy/docker/build-images.sh builds; marked `containers` (not in the
default suite). Containers talk only over the compose network; the host reaches published loopback ports.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.deploy.compose import BASE, ROOT, compose_command
from tests.e2e.conftest import EXAMPLES, tiny_config
from trinity.runtime.redis_server import free_port
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2

pytestmark = pytest.mark.containers

TOTAL_STEPS = 8
EXPLORERS = 3  # the explorer containers (and the run's explorers) once scaled mid-run
EXPLORING = (gateway_pb2.EVENT_KIND_EXPLORE, gateway_pb2.EVENT_KIND_WEIGHTS)  # what an explorer reports as it works

TOKEN = secrets.token_hex(16)  # compose requires TRINITY_AUTH_TOKEN; a fresh one per run, as a deployment makes
IMAGES = ["local/redis:7", "trinity/gateway:0.1.0", "trinity/buffer:0.1.0", "trinity/trainer:0.1.0-cpu",
          "trinity/explorer:0.1.0-cpu", "trinity/trackers:0.1.0"]  # fmt: skip
# Each service's own metrics (beyond the client library's process metrics), as the scrape must find them.
OWN_METRICS = {
    "gateway": ["trinity_gateway_runs", "trinity_gateway_events_total", "trinity_gateway_sync_groups_formed_total"],
    "buffer": ["trinity_buffer_put_total", "trinity_buffer_acked_total"],
    "trainer": ["trinity_trainer_step_seconds", "trinity_trainer_tokens_per_second", "trinity_trainer_loss",
                "trinity_trainer_grad_norm", "trinity_trainer_sync_seconds", "trinity_trainer_sync_bytes_total"],
    "explorer": ["trinity_explorer_rollout_tokens_per_second", "trinity_explorer_reward_mean",
                 "trinity_explorer_weight_version", "trinity_explorer_staleness"],
}  # fmt: skip


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


@dataclass
class Stack:
    project: str
    files: list[Path]
    env: dict[str, str]
    gateway: str
    metrics_ports: dict[str, list[int]]

    def compose(self, *args: str, timeout: float = 600) -> str:
        command = [*compose_command(), "-p", self.project, *(a for f in self.files for a in ("-f", str(f))), *args]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=self.env, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()

    def wait_healthy(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = {
                c: docker("inspect", "-f", "{{.State.Health.Status}}", c)
                for s in OWN_METRICS
                for c in self.containers(s)
            }
            if states and all(state == "healthy" for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not healthy after {timeout:.0f} s: {states}\n{self.compose('logs', '--tail=40')}"
                )
            time.sleep(2)


def _free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports: a published host range, one port per replica."""
    for _ in range(50):
        first, sockets = free_port(), []
        try:
            for port in range(first, first + count):
                sockets.append(socket.socket())
                sockets[-1].bind(("127.0.0.1", port))
        except OSError:
            continue
        else:
            return first
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError(f"no {count} consecutive free ports on 127.0.0.1")


def _job_folder(tmp_path: Path, tiny_model: Path) -> Path:
    """The model and task files, world-readable for the containers' uid 10001, mounted read-only at /job."""
    job = tmp_path / "job"
    shutil.copytree(tiny_model, job / "model")
    for name in ("train.jsonl", "eval.jsonl"):
        shutil.copy(EXAMPLES / name, job / name)
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return job


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model) -> Iterator[Stack]:
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker engine answers: `make test-containers` starts one (deploy/docker/engine.sh)")
    missing = [image for image in IMAGES if not docker("images", "-q", image)]
    assert not missing, f"images not built: {missing}; run deploy/docker/build-images.sh"
    tmp_path = tmp_path_factory.mktemp("containers")
    job = _job_folder(tmp_path, tiny_model)
    override = tmp_path / "docker-compose.job.yml"
    mount = {"volumes": [f"{job}:/job:ro"]}
    override.write_text(yaml.safe_dump({"services": {"buffer": mount, "explorer": mount, "trainer": mount}}))
    explorer_ports = _free_ports(EXPLORERS)  # the replicas take one each, in no fixed order
    metrics = {
        "gateway": [free_port()],
        "buffer": [free_port()],
        "trainer": [free_port()],
        "explorer": list(range(explorer_ports, explorer_ports + EXPLORERS)),
    }
    gateway_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")} | {
        "TRINITY_REDIS_IMAGE": "local/redis:7",
        "TRINITY_AUTH_TOKEN": TOKEN,
        "TRINITY_GATEWAY_PORT": str(gateway_port),
        # Every published port is a free one: the defaults (8300, 9101...) may be taken on the host running the test.
        "TRINITY_CONSOLE_PORT": str(free_port()),
        "TRINITY_GATEWAY_METRICS_PORT": str(metrics["gateway"][0]),
        "TRINITY_BUFFER_METRICS_PORT": str(metrics["buffer"][0]),
        "TRINITY_TRAINER_METRICS_PORT": str(metrics["trainer"][0]),
        "TRINITY_TRACKERS_METRICS_PORT": str(free_port()),
        "TRINITY_EXPLORER_METRICS_PORTS": f"{explorer_ports}-{explorer_ports + EXPLORERS - 1}",
        "TRINITY_EXPLORER_THREADS": "1",
        "TRINITY_TRAINER_THREADS": "2",
        # A restarted container registers under a new instance id: the old one is lost once silent this long.
        "TRINITY_LIVENESS_SECONDS": "5",
        "TRINITY_DATA_ROOTS": "/job",  # the buffer reads task files only inside its data roots
    }
    stack = Stack(f"trinity-test-{os.getpid()}", [*BASE, override], env, f"127.0.0.1:{gateway_port}", metrics)
    try:
        stack.compose("up", "-d", "--no-build", "--scale", "explorer=2")
        stack.wait_healthy()
        yield stack
    finally:
        (tmp_path / "compose.log").write_text(stack.compose("logs"))
        stack.compose("down", "--volumes", "--remove-orphans")


def _container_config() -> dict:
    return tiny_config(
        Path("/job/model"),
        **{
            "buffer.total_steps": TOTAL_STEPS,  # enough steps after the kill for the loss to be noticed
            "buffer.taskset.path": "/job/train.jsonl",
            "buffer.taskset.lease_seconds": 30,
            "buffer.eval_tasksets": [],
            "explorer.num_workers": 2,
            # A replacement explorer loads vLLM while two other services train and sample on the same cores.
            "synchronizer.timeout_seconds": 240,
        },
    )


@dataclass
class FinishedRun:
    final: gateway_pb2.Run
    events: list[gateway_pb2.RunEvent]
    group: gateway_pb2.SyncGroup  # the sync group as it stood at the first train step
    killed: str  # the explorer container whose process was killed
    restarts_before: int
    scaled: int  # the index in `events` of the first event after the explorer service was scaled to three
    scaled_group: gateway_pb2.SyncGroup | None  # the sync group at the first train step with all three exploring


@pytest.fixture(scope="module")
def finished_run(stack) -> FinishedRun:
    """The job, with one explorer container's process killed (SIGKILL from the host) after train step 1, then, once
    its replacement has started, the explorer service scaled to three containers and the run to three explorers.

    Exploration is paused just before the kill: the survivor holds after the step it has under way, so the run can
    reach its last step only through the restarted explorer (which starts unpaused). Unpaused, the survivor could
    finish the run alone while the replacement still loads its engine (the tiny model's whole run takes seconds),
    and the loss would end as a retirement instead.

    The scale-up waits for the replacement, so that the third container cannot be the one that replaces the killed
    explorer, and pauses it too: the run holds until the third explorer (which starts unpaused) has loaded its engine
    and taken the weights, so it joins before training ends however long that takes (the gateway lets a run train
    on while a joining explorer loads). Then exploration resumes on all three."""
    events: list[gateway_pb2.RunEvent] = []
    group: gateway_pb2.SyncGroup | None = None
    scaled_group: gateway_pb2.SyncGroup | None = None
    killed, replacement, joiner, restarts_before, scaled, resumed = "", "", "", 0, 0, False
    with TrinityClient(stack.gateway, token=TOKEN) as client:
        run = client.create_run(_container_config())
        for event in run.watch():
            events.append(event)
            if event.kind == gateway_pb2.EVENT_KIND_TRAIN and group is None:
                group = client.stub.GetSyncGroup(gateway_pb2.GetSyncGroupRequest(run_id=run.id), timeout=10)
            if event.kind == gateway_pb2.EVENT_KIND_TRAIN and not killed:
                assert run.steer(pause_exploration=True).applied == ["pause_exploration"]
                killed = stack.containers("explorer")[0]
                restarts_before = int(docker("inspect", "-f", "{{.RestartCount}}", killed))
                os.kill(int(docker("inspect", "-f", "{{.State.Pid}}", killed)), 9)
            if killed and not replacement and _replaced(event.message):
                replacement = event.message.split()[1]
            elif replacement and not scaled and event.message == f"explorer {replacement} started":
                assert run.steer(pause_exploration=True).applied == ["pause_exploration"]  # the replacement
                assert run.scale(EXPLORERS).explorers == EXPLORERS
                scale = ("--no-build", "--no-recreate", "--no-deps", "--scale", f"explorer={EXPLORERS}", "explorer")
                stack.compose("up", "-d", *scale)
                scaled = len(events)
            elif scaled and not joiner and event.message.startswith("explorer ") and " joins (" in event.message:
                joiner = event.message.split()[1]
            elif joiner and not resumed and event.source == f"explorer/{joiner}" and event.kind in EXPLORING:
                assert run.steer(pause_exploration=False).applied == ["pause_exploration"]
                resumed = True
            elif resumed and event.kind == gateway_pb2.EVENT_KIND_TRAIN and scaled_group is None:
                scaled_group = client.stub.GetSyncGroup(gateway_pb2.GetSyncGroupRequest(run_id=run.id), timeout=10)
        final = run.wait(timeout=300)
    assert group is not None and killed, f"the run ended before train step 1: {final.error}"
    assert scaled, f"the killed explorer's replacement did not start: {final.error}"
    assert resumed, f"the third explorer did not join: {final.error}"
    return FinishedRun(final, events, group, killed, restarts_before, scaled, scaled_group)


def _replaced(message: str) -> bool:
    """Whether a run event says a lost explorer's replacement was assigned (its own id back, or a free one)."""
    return message.endswith(" restarted") or " replaces " in message


def test_the_job_succeeds_with_two_explorers_in_the_sync_group(finished_run):
    final = finished_run.final
    assert gateway_pb2.RunState.Name(final.state) == "RUN_STATE_SUCCEEDED", final.error
    assert (final.train_step, final.model_version) == (TOTAL_STEPS, TOTAL_STEPS)
    group = finished_run.group
    assert group.world_size == 3 and len(group.members) == 3 and group.backend == "gloo"  # trainer + 2 explorers


def test_a_killed_explorer_container_is_restarted_and_rejoins(finished_run):
    restarts = int(docker("inspect", "-f", "{{.RestartCount}}", finished_run.killed))
    assert restarts == finished_run.restarts_before + 1  # the restart policy, not the test, brought it back
    messages = [e.message for e in finished_run.events]
    listing = "\n".join(messages)
    # Lost by silence, or by its restarted process registering first (the restart can beat the liveness window).
    assert any(" lost (" in m for m in messages), listing
    assert any(_replaced(m) for m in messages), listing
    generations = {m for m in messages if m.startswith("sync group generation")}
    assert len(generations) >= 2, listing  # the group was re-formed with the replacement
    rejoined = messages.index(next(m for m in messages if _replaced(m)))
    trained = [e.step for e in finished_run.events[rejoined:] if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
    # The survivor held until the replacement had rejoined (and the third explorer joined): the rest trained after.
    assert trained and trained[-1] == TOTAL_STEPS, listing
    assert gateway_pb2.RunState.Name(finished_run.final.state) == "RUN_STATE_SUCCEEDED"


def test_a_third_explorer_container_started_mid_run_joins_the_run(stack, finished_run):
    assert len(stack.containers("explorer")) == EXPLORERS  # `up --scale` added one; the restarted one stayed
    events = finished_run.events
    messages = [e.message for e in events]
    listing = "\n".join(messages)
    assert f"explorers scaled from 2 to {EXPLORERS}" in messages, listing
    joins = [m.split()[1] for m in messages if m.startswith("explorer ") and f" joins ({EXPLORERS} of " in m]
    assert len(joins) == 1, listing  # the new container, assigned once it registered
    # From the scale-up on, three explorers (the survivor, the replacement and the newcomer) took weights or explored.
    since = events[finished_run.scaled :]
    after = {e.source for e in since if e.kind in EXPLORING and e.source.startswith("explorer/")}
    assert len(after) == EXPLORERS and f"explorer/{joins[0]}" in after, (after, listing)
    group = finished_run.scaled_group
    assert group is not None, listing
    assert group.world_size == EXPLORERS + 1 and len(group.members) == EXPLORERS + 1, group  # trainer + 3 explorers
    assigned = {f"explorer/{i}" for i, role in finished_run.final.assignments.items() if role == "explorer"}
    assert assigned == after, (assigned, after)  # the run ended with the three as its explorers
    joined = messages.index(next(m for m in messages if " joins (" in m))
    trained = [e.step for e in events[joined:] if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
    assert trained and trained[-1] == TOTAL_STEPS, listing  # it joined before training ended
    assert gateway_pb2.RunState.Name(finished_run.final.state) == "RUN_STATE_SUCCEEDED"


@pytest.mark.parametrize("service", sorted(OWN_METRICS))
def test_every_service_exports_its_own_metrics(stack, finished_run, service):
    stack.wait_healthy()  # the killed explorer's replacement serves its metrics once it is up again
    for port in stack.metrics_ports[service][: len(stack.containers(service))]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
        missing = [m for m in OWN_METRICS[service] if not any(n.startswith(m) for n in names)]
        assert not missing, f"{service} on :{port} lacks {missing}"


def test_published_ports_listen_on_loopback_only(stack):
    for service in OWN_METRICS:
        for container in stack.containers(service):
            bindings = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Ports}}", container))
            hosts = {b["HostIp"] for mapped in bindings.values() if mapped for b in mapped}
            assert hosts <= {"127.0.0.1"}, (service, hosts)


@pytest.mark.parametrize(("service", "allocator"), [("trainer", True), ("explorer", True), ("gateway", False)])
def test_the_tensor_services_run_on_jemalloc(stack, finished_run, service, allocator):
    for container in stack.containers(service):
        maps = docker("exec", container, "cat", "/proc/1/maps")
        assert ("libjemalloc" in maps) == allocator, (service, container)
