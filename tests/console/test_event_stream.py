"""The console's event stream keeps a quiet watch alive with SSE comments, and passes every event on in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from trinity.console.app import _with_keepalives


def test_a_quiet_watch_yields_keepalives_until_its_events_come():
    async def scenario() -> list[int | None]:
        gate = asyncio.Event()

        async def events() -> AsyncIterator[int]:
            await gate.wait()  # nothing until the reader has seen a keepalive
            yield 1
            yield 2

        seen: list[int | None] = []
        async for item in _with_keepalives(events(), every_s=0.01):
            if item is None and None in seen:
                continue
            seen.append(item)
            gate.set()
        return seen

    assert asyncio.run(scenario()) == [None, 1, 2]


def test_a_failing_watch_raises_to_the_reader():
    async def scenario() -> None:
        async def events() -> AsyncIterator[int]:
            yield 1
            raise RuntimeError("gateway lost")

        async for _ in _with_keepalives(events(), every_s=10):
            pass

    with pytest.raises(RuntimeError, match="gateway lost"):
        asyncio.run(scenario())
