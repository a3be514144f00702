"""Buffer process setup that the gRPC tests do not see directly."""

from __future__ import annotations

import sys

import pytest

from trinity.buffer.server import keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings")
def test_the_allocator_keeps_large_freed_blocks_on_glibc():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert keep_freed_memory()
    big = [bytes(600_000) for _ in range(4)]  # still allocates and frees as usual
    del big
