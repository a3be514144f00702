"""A gateway's run lifecycle, driven step by step: the orchestrator's parts on a Redis of their own, a real buffer,
and explorers and trainers played by in-process gRPC services that record what the gateway asks of them.

Nothing waits on time: the monitor's sweep is called by the test, a reported event's consequences run on the
caller's thread, and the clock that times the recovery deadline is moved by hand."""

from __future__ import annotations

import uuid
from concurrent import futures
from pathlib import Path

import grpc
import redis
import redis.asyncio
import yaml

from trinity.gateway import keys
from trinity.gateway.orchestrator import Orchestrator
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import RunStore, now_ms
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.events import kind_name
from trinity.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc, gateway_pb2, trainer_pb2_grpc

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
LIVENESS_S = 3600.0  # instances stay alive until a test silences one (`lose`), however slow the machine
RECOVERY_S = 300.0


def run_config(*, name: str, stages: tuple[dict, ...] = (), **top: object) -> str:
    """A `both` run of one explorer and one trainer on the quickstart's task set (the gateway loads no model);
    `top` replaces top-level keys (`mode`, `explorer`)."""
    taskset = {"path": str(EXAMPLES / "train.jsonl"), "prompt_key": "question", "answer_key": "answer"}
    config = {
        "name": name,
        "mode": "both",
        "model": {"path": "base-model"},
        "buffer": {"batch_size": 2, "total_steps": 2, "taskset": {**taskset, "reward_fn": "accuracy"}},
        "stages": list(stages),
        **top,
    }
    return yaml.safe_dump(config)


class FakeService(explorer_pb2_grpc.ExplorerServiceServicer, trainer_pb2_grpc.TrainerServiceServicer):
    """An explorer or trainer process as the gateway sees it: it records StartRun and StopRun, and refuses to
    start while `refuse_start` is set (as a process busy with another run does)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.instance_id = f"{service}-{uuid.uuid4().hex[:6]}"
        self.starts: list[explorer_pb2.StartRunRequest] = []
        self.stops: list[explorer_pb2.StopRunRequest] = []
        self.refuse_start = False
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        if service == "trainer":
            trainer_pb2_grpc.add_TrainerServiceServicer_to_server(self, self.server)
        else:
            explorer_pb2_grpc.add_ExplorerServiceServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def StartRun(
        self, request: explorer_pb2.StartRunRequest, context: grpc.ServicerContext
    ) -> common_pb2.ServiceStatus:
        if self.refuse_start:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "busy with another run")
        self.starts.append(request)
        return common_pb2.ServiceStatus()

    def StopRun(self, request: explorer_pb2.StopRunRequest, context: grpc.ServicerContext) -> common_pb2.ServiceStatus:
        self.stops.append(request)
        return common_pb2.ServiceStatus()

    def stop_reasons(self) -> list[str]:
        return [explorer_pb2.StopReason.Name(s.reason) for s in self.stops]


class Clock:
    """Unix milliseconds that move only when the test says so."""

    def __init__(self) -> None:
        self.ms = now_ms()

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


class Gateway:
    """The orchestrator on `redis_url`, with a trainer and an explorer registered beside the buffer at
    `buffer_address`."""

    def __init__(self, redis_url: str, buffer_address: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.registry = InstanceRegistry(self.client, liveness_seconds=LIVENESS_S)
        self.clock = Clock()
        self.orchestrator = Orchestrator(
            RunStore(self.client, redis.asyncio.Redis.from_url(redis_url)),
            self.registry,
            SyncGroups(self.client),
            recovery_seconds=RECOVERY_S,
            clock=self.clock,
            spawn=lambda fn, *args: fn(*args),
        )
        self.registry.register(gateway_pb2.Instance(instance_id="buffer-0", service="buffer", address=buffer_address))
        self.trainer, self.explorer = FakeService("trainer"), FakeService("explorer")
        for fake in (self.trainer, self.explorer):
            self.register(fake, started=1)

    def close(self) -> None:
        self.orchestrator.stop()
        for fake in (self.trainer, self.explorer):
            fake.server.stop(None)
        self.client.close()

    def register(self, fake: FakeService, *, started: int) -> None:
        instance = gateway_pb2.Instance(
            instance_id=fake.instance_id, service=fake.service, address=fake.address, started_unix_ms=started
        )
        self.orchestrator.on_registered(self.registry.register(instance))

    def launch(self, name: str, stages: tuple[dict, ...] = (), **top: object) -> str:
        """A run created and launched at once (the monitor would launch it on its next sweep)."""
        run = self.orchestrator.create_run(run_config(name=name, stages=stages, **top), run_id=name)
        self.orchestrator.stages.launch(run.id)
        assert self.run(run.id).state == gateway_pb2.RUN_STATE_RUNNING, self.run(run.id).error
        return run.id

    def run(self, run_id: str) -> gateway_pb2.Run:
        return self.orchestrator.ledger.runs.get(run_id)

    def report(self, run_id: str, fake: FakeService, kind: gateway_pb2.EventKind, **fields: object) -> None:
        event = gateway_pb2.RunEvent(
            run_id=run_id, kind=kind, source=f"{fake.service}/{fake.instance_id}", event_id=uuid.uuid4().hex
        )
        for name, value in fields.items():
            setattr(event, name, value)
        self.orchestrator.report(event)

    def silence(self, fake: FakeService) -> None:
        """The instance stops heartbeating, long enough ago that the next sweep declares it lost."""
        instance = self.registry.get(fake.instance_id)
        assert instance is not None
        instance.last_heartbeat_unix_ms = 0
        self.registry.save(instance)
        self.registry.started_ms = 0  # and this gateway had been up all along

    def events(self, run_id: str) -> list[tuple[str, str]]:
        """The run's events so far as (kind, message)."""
        rows = self.client.xrange(keys.events(run_id))
        return [(kind_name(e.kind), e.message) for e in (gateway_pb2.RunEvent.FromString(f[b"e"]) for _, f in rows)]
