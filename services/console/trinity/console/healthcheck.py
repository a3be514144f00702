"""The image's health check: `python -m trinity.console.healthcheck` exits 0 when the console answers /health."""

from __future__ import annotations

import os
import sys
import urllib.request

from trinity.console.settings import DEFAULT_PORT


def main() -> int:
    port = os.environ.get("TRINITY_CONSOLE_PORT", str(DEFAULT_PORT))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return 0 if reply.status == 200 else 1
    except OSError as err:
        print(f"console not answering on port {port}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
