"""Test hosts for the multi-host tests: `network(labels)` makes namespaces torn down after the test, pass or fail."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.multihost.netns import HostNetwork, NetnsUnavailable, unavailable_reason


@pytest.fixture
def network() -> Iterator[Callable[[Sequence[str]], HostNetwork]]:
    made: list[HostNetwork] = []

    def make(labels: Sequence[str]) -> HostNetwork:
        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        try:
            made.append(HostNetwork.up(labels))
        except NetnsUnavailable as err:
            pytest.skip(str(err))
        return made[-1]

    yield make
    for net in made:
        net.close()
