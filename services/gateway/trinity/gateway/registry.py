"""The service registry: instances register, heartbeat, and are declared dead when they fall silent."""

from __future__ import annotations

from typing import cast

import redis

from trinity.gateway import keys
from trinity.gateway.runs import now_ms
from trinity.v1 import gateway_pb2


class InstanceRegistry:
    def __init__(self, client: redis.Redis, heartbeat_interval: float = 1.0, liveness_seconds: float = 30.0) -> None:
        self.client = client
        self.heartbeat_interval = heartbeat_interval
        self.dead_after_ms = int(liveness_seconds * 1000)
        # Silence while this gateway was down is not the instances' fault: their window starts here at the latest.
        self.started_ms = now_ms()

    def register(self, instance: gateway_pb2.Instance) -> gateway_pb2.Instance | None:
        """Record `instance` as alive; returns the incarnation it replaces when a new process took over the
        id (a supervisor restarted it faster than the liveness window could notice), else None."""
        previous = self.get(instance.instance_id)
        instance.alive = True
        instance.last_heartbeat_unix_ms = now_ms()
        self.client.hset(keys.INSTANCES, instance.instance_id, instance.SerializeToString())
        replaced = previous is not None and previous.started_unix_ms != instance.started_unix_ms
        return previous if replaced else None

    def heartbeat(self, instance_id: str, run_id: str = "", stage: int = 0) -> bool:
        instance = self.get(instance_id)
        if instance is None:
            return False
        instance.last_heartbeat_unix_ms = now_ms()
        instance.alive = True
        instance.run_id, instance.stage = run_id, stage
        self.client.hset(keys.INSTANCES, instance_id, instance.SerializeToString())
        return True

    def get(self, instance_id: str) -> gateway_pb2.Instance | None:
        raw = cast("bytes | None", self.client.hget(keys.INSTANCES, instance_id))  # replies are not decoded
        return gateway_pb2.Instance.FromString(raw) if raw is not None else None

    def save(self, instance: gateway_pb2.Instance) -> None:
        self.client.hset(keys.INSTANCES, instance.instance_id, instance.SerializeToString())

    def instances(self, service: str = "") -> list[gateway_pb2.Instance]:
        out = [gateway_pb2.Instance.FromString(cast(bytes, v)) for v in self.client.hvals(keys.INSTANCES)]
        return sorted((i for i in out if not service or i.service == service), key=lambda i: i.instance_id)

    def alive(self, service: str) -> list[gateway_pb2.Instance]:
        return [i for i in self.instances(service) if i.alive]

    def sweep(self) -> list[gateway_pb2.Instance]:
        """Mark instances whose heartbeat is overdue as dead; return the newly dead ones."""
        deadline = now_ms() - self.dead_after_ms
        newly_dead = []
        for instance in self.instances():
            if instance.alive and max(instance.last_heartbeat_unix_ms, self.started_ms) < deadline:
                instance.alive = False
                self.save(instance)
                newly_dead.append(instance)
        return newly_dead
