"""Service errors that map to gRPC status codes, and the decorator that does the mapping.

Servicer code raises these (or pydantic / config errors) and never touches `context.abort` itself, so
every service reports bad input the same way: the right status code and a message naming the field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc
import redis
from pydantic import ValidationError

from trinity.config.errors import ConfigError, format_validation_error
from trinity.runtime.logging import get_logger

log = get_logger(__name__)


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


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


def require(value: str, field: str) -> str:
    """A request field that must be set; INVALID_ARGUMENT naming it otherwise."""
    if not value:
        raise InvalidArgument(field, "must be set")
    return value


F = TypeVar("F", bound=Callable[..., Any])


def grpc_errors(method: F) -> F:
    """Turn the errors above, validation errors and lost Redis connections into gRPC statuses."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except ServiceError as err:
            context.abort(err.code, str(err))
        except ValidationError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, format_validation_error(err))
        except ConfigError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except (redis.ConnectionError, redis.TimeoutError) as err:
            log.warning("redis.unavailable", method=method.__name__, error=str(err))
            context.abort(grpc.StatusCode.UNAVAILABLE, f"redis unavailable: {err}")

    return cast(F, wrapper)  # functools.wraps keeps the signature mypy cannot see through
