"""Requests whose bytes do not parse are INVALID_ARGUMENT naming the message type, on every service.

grpc parses a request with the method's deserializer before any handler runs, and a parse error there ends the call
UNKNOWN ("Unexpected DecodeError ... Wire format was corrupt"), which says the service failed rather than the caller.
The interceptor swaps in a deserializer that hands such bytes on as `Unparsed`, and a handler wrapper that refuses
them before the servicer sees them.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError


@dataclass(frozen=True)
class Unparsed:
    type_name: str
    error: str

    @property
    def message(self) -> str:
        return f"request: not a valid {self.type_name} ({self.error})"


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    owner = getattr(parse, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    type_name = descriptor.full_name if descriptor is not None else getattr(owner, "__name__", "request message")

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, RuntimeError) as err:  # upb raises DecodeError; a custom parser may not
            return Unparsed(type_name, str(err) or type(err).__name__)

    return deserialize


def _refusing(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """`behavior` of the same kind (coroutine, async generator, plain function or generator), refusing `Unparsed`."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Unparsed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            async for reply in behavior(request, context):
                yield reply

        return stream
    if inspect.iscoroutinefunction(behavior):

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Unparsed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return await behavior(request, context)

        return unary
    if inspect.isgeneratorfunction(behavior):

        def generator(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            if isinstance(request, Unparsed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            yield from behavior(request, context)

        return generator

    def plain(request: Any, context: grpc.ServicerContext) -> Any:  # run on the server's thread pool
        if isinstance(request, Unparsed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return behavior(request, context)

    return plain


class CorruptRequestInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler  # no method, or one that parses nothing itself (no client-streaming method exists here)
        kind = "unary_stream" if handler.response_streaming else "unary_unary"
        return handler._replace(  # grpc's handlers are named tuples
            request_deserializer=_tolerant(handler.request_deserializer),
            **{kind: _refusing(getattr(handler, kind))},
        )
