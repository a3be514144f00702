"""Data roots: every path a client names (task sets, offline data, exports) must resolve inside one of them.

A path is resolved as the operating system would open it (symlinks followed, `..` collapsed, relative paths
from the buffer's working directory) and then compared with the roots, which are resolved the same way. A
path outside every root is refused with one message, whether or not it exists, so the buffer cannot be asked
which files its host has. Inside a root the client may learn what exists: that is where its data lives.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from trinity.runtime.errors import InvalidArgument, NotFound, PermissionDenied, bounded
from trinity.runtime.limits import MAX_PATH_CHARS
from trinity.runtime.logging import get_logger

log = get_logger(__name__)


class DataRoots:
    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(dict.fromkeys(Path(os.path.realpath(root)) for root in roots))
        if not self.roots:
            raise ValueError("the buffer needs at least one data root (TRINITY_DATA_ROOTS)")

    def resolve(self, path: str, field: str) -> Path:
        """The real path of `path` if it lies inside a root; PERMISSION_DENIED naming `field` otherwise."""
        bounded(path, field, MAX_PATH_CHARS)
        if "\0" in path:
            raise InvalidArgument(field, "contains a NUL character")
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(root) for root in self.roots):
            log.warning("path.refused", field=field, resolved=str(real))
            raise PermissionDenied(
                f"{field}: {path!r} is outside the buffer's data roots; put the data under one of them "
                "(the operator sets them with TRINITY_DATA_ROOTS)"
            )
        return real

    def existing(self, path: str, field: str) -> Path:
        """`resolve`, for a path that must exist; NOT_FOUND shows the path as the client gave it."""
        real = self.resolve(path, field)
        if not real.exists():
            raise NotFound(f"{field}: {path!r} does not exist (paths are read on the buffer's machine)")
        return real

    def check_tree(self, directory: Path, field: str) -> None:
        """Every entry under a data directory resolves inside a root too (a symlink in it may point anywhere)."""
        for entry in directory.rglob("*"):
            self.resolve(str(entry), field)
