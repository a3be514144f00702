"""What coroutine handlers use: the few handlers that wait for a long time run on the server's event loop
(see `trinity.runtime.server`) and wait there holding no thread.

- `in_pool` runs their synchronous part (Redis work through the blocking client, validation) in the server's
  pool, called as a plain handler is, so `grpc_errors` maps its errors to status codes as it does everywhere;
- `connect_redis_async` is the client they wait with (XREAD BLOCK): one connection per waiting call, which a
  cancelled call drops, up to `MAX_WAITS` at once per process (redis-py's own default is 100).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import grpc
import redis.asyncio

T = TypeVar("T")
R = TypeVar("R")

# Calls waiting on Redis at once in one service process; a wait beyond it fails with redis.MaxConnectionsError
# (the buffer then answers the read at once, the gateway refuses the watch with RESOURCE_EXHAUSTED). Well under
# Redis's 10,000 clients, so that several services and replicas fit.
MAX_WAITS = 2000


class _PoolContext:
    """A coroutine handler's context as the synchronous code it runs in the pool sees it: `abort` is done on
    the loop and raises in the calling thread, as in the context grpc.aio gives plain handlers."""

    def __init__(self, context: grpc.aio.ServicerContext, loop: asyncio.AbstractEventLoop) -> None:
        self._context = context
        self._loop = loop

    def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        asyncio.run_coroutine_threadsafe(self._context.abort(code, details), self._loop).result()
        raise AssertionError("ServicerContext.abort returned")  # it always raises

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


async def in_pool(function: Callable[[R, Any], T], request: R, context: grpc.aio.ServicerContext) -> T:
    """`function(request, context)` in the server's pool (the loop's default executor), from a coroutine handler."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, function, request, _PoolContext(context, loop))


def connect_redis_async(url: str) -> redis.asyncio.Redis:
    """A client for waits on the loop. No retries of its own: a wait that fails hands over to a call through
    the blocking client (`connect_redis`, which rides out a Redis restart) or answers UNAVAILABLE, which
    callers retry. Waits block up to 60 s (XREAD BLOCK), so the socket timeout is longer; connections idle
    for a while are checked before use, since a restarted Redis has closed them."""
    return redis.asyncio.Redis.from_url(
        url, max_connections=MAX_WAITS, socket_connect_timeout=5, socket_timeout=90, health_check_interval=15
    )
