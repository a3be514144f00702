"""SDK errors: gRPC statuses turned into exceptions that say what to do."""

from __future__ import annotations

import grpc


class TrinityError(Exception):
    """Base class of every SDK error."""


class InvalidRequest(TrinityError):
    """The gateway refused a value of the request (INVALID_ARGUMENT); the message names the field."""


class InvalidRunConfig(InvalidRequest):
    """The gateway refused the run config; the message names the wrong field."""


class RunConflict(TrinityError):
    """The request is valid but the run cannot take it now (FAILED_PRECONDITION): it is not running, or the
    services cannot apply the change; the message says why."""


class RunNotFound(TrinityError):
    pass


class QuotaExceeded(TrinityError):
    """The gateway refused what would go beyond a quota or a limit (RESOURCE_EXHAUSTED): a tenant's quota (the
    message names the tenant and the quota), the gateway's limit on runs, a Redis out of memory."""


class NotPermitted(TrinityError):
    """The caller's token may not do this (PERMISSION_DENIED): another tenant's run, a priority above the tenant's
    max_priority, or a call only the services make."""


class GatewayUnavailable(TrinityError):
    pass


def translate(err: grpc.RpcError, target: str) -> TrinityError:
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRunConfig(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return RunNotFound(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return RunConflict(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return QuotaExceeded(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return NotPermitted(details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return GatewayUnavailable(f"gateway at {target} is not answering ({code.name}); is `trinity serve gateway` up?")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return TrinityError(f"{details} (pass token= or set TRINITY_AUTH_TOKEN)")
    return TrinityError(f"{code.name}: {details}")
