"""Errors of the weight-sync layer; each says what the caller should do next."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class SyncError(RuntimeError):
    """A weight update failed: a member died, a collective timed out, or the protocol broke.

    The group is unusable afterwards: close it and re-form it with a new `SyncGroupSpec.generation`.
    """


class ChecksumMismatch(SyncError):
    """Received bytes differ from what the trainer sent; the version was refused, nothing was handed to the engine.

    Unlike other `SyncError`s the group stays usable: every member finished the update's message sequence.
    """


class StaleVersion(SyncError):
    """A version that is not newer than the last one published or served (weight versions only increase)."""


class NoUpdateYet(SyncError):
    """`receive(idle_timeout_s=...)` waited and no update began. Nothing was consumed and the group is
    still usable: call `receive()` again."""


@contextlib.contextmanager
def as_sync_error(what: str, on_failure: Callable[[str], None] | None = None) -> Iterator[None]:
    """Any exception inside (a process group, the store, a CUDA call) leaves as a `SyncError` naming `what`,
    so callers retry one error type and re-form the group; `on_failure(reason)` runs first (mark it broken)."""
    try:
        yield
    except SyncError:
        raise
    except Exception as err:
        reason = f"{what}: {err!r}"
        if on_failure is not None:
            on_failure(reason)
        raise SyncError(f"{reason}; re-form the group with a new generation") from err
