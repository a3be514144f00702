"""Announcing weight versions in a sync generation: versions only increase, and an announcement repeated by a retry
(its first reply lost to a dropped connection after the gateway answered) is accepted, not refused."""

from __future__ import annotations

import pytest
import redis

from tests.gateway.test_sync_groups import _request
from trinity.config import SynchronizerConfig
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.errors import FailedPrecondition


@pytest.fixture
def groups(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield SyncGroups(client)
    client.close()


def test_an_announcement_repeated_in_its_generation_is_accepted_again(groups, unique):
    generation = groups.open(_request(unique, SynchronizerConfig())).generation
    groups.announce(unique, generation, 3)
    assert groups.announce(unique, generation, 3).announced_version == 3


def test_an_older_version_is_refused(groups, unique):
    generation = groups.open(_request(unique, SynchronizerConfig())).generation
    groups.announce(unique, generation, 3)
    with pytest.raises(FailedPrecondition, match="only increase: 2 < announced 3"):
        groups.announce(unique, generation, 2)


def test_an_announcement_for_a_generation_that_is_over_is_refused(groups, unique):
    first = groups.open(_request(unique, SynchronizerConfig())).generation
    groups.open(_request(unique, SynchronizerConfig()))
    with pytest.raises(FailedPrecondition, match=f"generation {first} is over"):
        groups.announce(unique, first, 1)
