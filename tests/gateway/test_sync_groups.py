"""Opening a sync group: the trainer's synchronizer section is the only source of its settings."""

from __future__ import annotations

import pytest
import redis

from trinity.config import SynchronizerConfig
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.errors import InvalidArgument
from trinity.v1 import gateway_pb2


@pytest.fixture
def groups(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield SyncGroups(client)
    client.close()


def _request(run_id: str, sync: SynchronizerConfig, **changes: object) -> gateway_pb2.OpenSyncGroupRequest:
    fields: dict[str, object] = {
        "run_id": run_id,
        "instance_id": "trainer-1",
        "host": "127.0.0.1",
        "port": 29500,
        "backend": sync.method,
        "explorer_workers": 1,
        "timeout_seconds": sync.timeout_seconds,
        "bucket_mb": sync.bucket_mb,
    }
    return gateway_pb2.OpenSyncGroupRequest(**{**fields, **changes})


def test_a_group_carries_the_synchronizer_settings_it_was_opened_with(groups, unique):
    sync = SynchronizerConfig(method="gloo", timeout_seconds=7.5, bucket_mb=2.0)
    group = groups.open(_request(unique, sync))
    assert (group.backend, group.timeout_seconds, group.bucket_mb) == ("gloo", 7.5, 2.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"backend": ""}, "backend"), ({"timeout_seconds": 0.0}, "timeout_seconds"), ({"bucket_mb": 0.0}, "bucket_mb")],
)
def test_a_request_without_a_synchronizer_setting_is_refused_not_defaulted(groups, unique, changes, field):
    with pytest.raises(InvalidArgument) as info:
        groups.open(_request(unique, SynchronizerConfig(), **changes))
    assert info.value.field == field
