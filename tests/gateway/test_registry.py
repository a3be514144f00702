"""The instance registry: incarnations, the liveness window, and a gateway's own downtime."""

from __future__ import annotations

import pytest
import redis

from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import now_ms
from trinity.v1 import gateway_pb2


@pytest.fixture
def client(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def _instance(instance_id: str, started: int) -> gateway_pb2.Instance:
    return gateway_pb2.Instance(
        instance_id=instance_id, service="trainer", address="127.0.0.1:1", started_unix_ms=started
    )


def test_a_new_process_under_a_known_id_reports_the_incarnation_it_replaced(client, unique):
    registry = InstanceRegistry(client)
    assert registry.register(_instance(unique, started=1000)) is None
    replaced = registry.register(_instance(unique, started=2000))
    assert replaced is not None and replaced.started_unix_ms == 1000
    current = registry.get(unique)
    assert current is not None and current.started_unix_ms == 2000 and current.alive


def test_the_same_process_registering_again_replaces_nothing(client, unique):
    registry = InstanceRegistry(client)
    registry.register(_instance(unique, started=1000))
    assert registry.register(_instance(unique, started=1000)) is None  # after a gateway that forgot it


def test_an_instance_is_lost_only_after_the_liveness_window(client, unique):
    registry = InstanceRegistry(client, liveness_seconds=30)
    registry.started_ms -= 60_000  # this gateway has been up for a minute
    registry.register(_instance(unique, started=1))
    instance = registry.get(unique)
    assert instance is not None
    instance.last_heartbeat_unix_ms = now_ms() - 20_000  # a 20 s stall is tolerated
    registry.save(instance)
    assert unique not in [i.instance_id for i in registry.sweep()]
    instance.last_heartbeat_unix_ms = now_ms() - 31_000
    registry.save(instance)
    assert unique in [i.instance_id for i in registry.sweep()]


def test_a_restarted_gateway_does_not_blame_instances_for_its_own_downtime(client, unique):
    InstanceRegistry(client).register(_instance(unique, started=1))
    instance = InstanceRegistry(client).get(unique)
    assert instance is not None
    instance.last_heartbeat_unix_ms = now_ms() - 120_000  # silent while no gateway was there to hear it
    InstanceRegistry(client).save(instance)
    restarted = InstanceRegistry(client, liveness_seconds=30)
    assert unique not in [i.instance_id for i in restarted.sweep()]
