"""`python -m benchmarks [--quick] [--only NAME ...]`: run every benchmark, print and save JSON results."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help="benchmark names, e.g. buffer trainer")
    args = parser.parse_args()
    names = sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if m.name.startswith("bench_")
    )
    selected = [n for n in names if args.only is None or n in args.only]
    if args.only and not selected:
        print(f"no benchmark named {args.only}; known: {', '.join(names)}", file=sys.stderr)
        return 2
    failed = 0
    for name in selected:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"== {name}", flush=True)
        try:
            result = module.run(quick=args.quick)
        except Exception as err:  # noqa: BLE001 - one broken benchmark must not hide the others' numbers
            print(f"{name} failed: {err!r}", file=sys.stderr)
            failed += 1
            continue
        print(json.dumps(result, indent=2), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
