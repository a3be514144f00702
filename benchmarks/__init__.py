"""Benchmarks: each `bench_*.py` module has `run(quick: bool) -> dict` and writes results/<name>.json."""
