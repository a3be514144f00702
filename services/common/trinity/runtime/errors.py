"""Service errors that map to gRPC status codes, and the decorator that does the mapping.

Servicer code raises these (or pydantic / config errors) and never touches `context.abort` itself, so
every service reports bad input the same way: the right status code and a message naming the field.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sized
from typing import Any, TypeVar, cast

import grpc
import redis
from pydantic import ValidationError

from trinity.config.errors import ConfigError, format_validation_error
from trinity.runtime.limits import MAX_ERROR_DETAIL_BYTES, MAX_ITEMS, MAX_NAME_CHARS
from trinity.runtime.logging import get_logger

log = get_logger(__name__)

# The start of the RESOURCE_EXHAUSTED detail of a call Redis refused at its `maxmemory`: clients retry such a call
# (`call_with_retry`), because consumers acking and trimming free the memory, unlike the other RESOURCE_EXHAUSTED
# answers (a request over a size limit), which fail the same way every time.
REDIS_FULL = "redis is out of memory"


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


def require(value: str, field: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """A request field that must be set and fit its bound (a name by default); INVALID_ARGUMENT naming it otherwise."""
    if not value:
        raise InvalidArgument(field, "must be set")
    return bounded(value, field, max_chars)


def bounded(value: str, field: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """A string field of at most `max_chars` characters (trinity.runtime.limits); INVALID_ARGUMENT otherwise."""
    if len(value) > max_chars:
        raise InvalidArgument(field, f"{len(value)} characters; at most {max_chars} are allowed")
    return value


def at_most(items: Sized, field: str, limit: int = MAX_ITEMS) -> None:
    """A repeated or map field of at most `limit` entries; RESOURCE_EXHAUSTED naming it otherwise (as gRPC answers
    a message over its size limit: the request is well formed, only too big for one call)."""
    if len(items) > limit:
        raise ResourceExhausted(f"{field}: {len(items)} entries exceed the limit of {limit} per request; split it")


def in_range(value: float, field: str, low: float, high: float) -> float:
    """A finite number in [low, high]; NaN and infinities are out of every range."""
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidArgument(field, f"must be a number between {low:g} and {high:g}, got {value}")
    return value


F = TypeVar("F", bound=Callable[..., Any])


def grpc_errors(method: F) -> F:
    """Turn the errors above, validation errors and lost Redis connections into gRPC statuses."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except ServiceError as err:
            _abort(context, err.code, str(err))
        except ValidationError as err:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, format_validation_error(err))
        except ConfigError as err:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except (redis.ConnectionError, redis.TimeoutError) as err:
            log.warning("redis.unavailable", method=method.__name__, error=str(err))
            _abort(context, grpc.StatusCode.UNAVAILABLE, f"redis unavailable: {err}")
        except redis.exceptions.OutOfMemoryError as err:
            # Redis refuses a whole MULTI (and a script before its first write) at its limit, so the call changed
            # nothing and may be repeated.
            log.warning("redis.full", method=method.__name__, error=str(err))
            message = f"{REDIS_FULL} ({err}); retry once consumers have acked and trimmed, or raise its maxmemory"
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        except Exception as err:
            if _aborted(context, err):
                raise
            # A bug, not bad input: the traceback goes to the log, the caller gets INTERNAL (gRPC would say
            # UNKNOWN and echo the exception's text).
            log.exception("rpc.failed", method=method.__name__)
            _abort(
                context,
                grpc.StatusCode.INTERNAL,
                f"{method.__name__} failed ({type(err).__name__}); the service log has the traceback; please report it",
            )

    return cast(F, wrapper)  # functools.wraps keeps the signature mypy cannot see through


def _aborted(context: grpc.ServicerContext, err: Exception) -> bool:
    """Whether `err` is the method's own `context.abort`: grpc.aio raises AbortError, the threaded server a bare
    Exception once it has recorded the status."""
    if isinstance(err, grpc.aio.AbortError):
        return True
    code = getattr(context, "code", None)
    return callable(code) and code() is not None


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """Abort with `message` cut to MAX_ERROR_DETAIL_BYTES: a message that echoes a huge input (a 10 KB name)
    would overflow the metadata limit and reach the caller as RESOURCE_EXHAUSTED instead of its own status."""
    data = message.encode()
    if len(data) > MAX_ERROR_DETAIL_BYTES:
        kept = data[: MAX_ERROR_DETAIL_BYTES - 32].decode(errors="ignore")
        message = f"{kept}... ({len(data) - len(kept.encode())} bytes cut)"
    context.abort(code, message)


def one_line(err: BaseException) -> str:
    """An error as one line for a run's event log: a gRPC error as its status and details (its repr spans
    many lines), anything else as its type and the first line of its message."""
    if isinstance(err, grpc.RpcError) and isinstance(err, grpc.Call):
        return f"{err.code().name}: {err.details()}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
