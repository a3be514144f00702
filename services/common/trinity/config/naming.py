"""Buffer names a run uses; every service derives them the same way from (run id, stage)."""

from __future__ import annotations


def experience_stream(run_id: str, stage: int, name: str = "experiences") -> str:
    return f"{run_id}.s{stage}.{name}"


def taskset(run_id: str, stage: int, name: str) -> str:
    return f"{run_id}.s{stage}.{name}"
