"""What a W&B offline run wrote, read back from its `.wandb` file: the run's config, its history rows and summary.

The file is W&B's transaction log: a 7-byte header (`:W&B`, magic, version), then LevelDB log records (32 KiB
blocks; each record a 7-byte header, crc32c, length, type: full / first / middle / last) whose payloads are
`wandb_internal_pb2.Record` messages. wandb ships no reader for it any more; this is the format `wandb sync` reads.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, parts = HEADER, []
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            position += left
            continue
        parts.append(data[position + HEADER : position + HEADER + length])
        position += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    project: str = ""
    run_id: str = ""


def read_runs(wandb_dir: Path, run_id: str) -> list[OfflineRun]:
    """Every offline run file of W&B run `run_id` under `wandb_dir` (a resumed run writes one more), oldest first."""
    runs = []
    for path in sorted(wandb_dir.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        run = OfflineRun()
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.project, run.run_id = record.run.project, record.run.run_id
                run.config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                run.config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
            elif kind == "summary":
                run.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        runs.append(run)
    return runs


def series(runs: list[OfflineRun], key: str, axis: str) -> list[tuple[Any, Any]]:
    """(x, value) of `key` in every row that has it, across the files of one run, in the order written."""
    return [(row[axis], row[key]) for run in runs for row in run.history if key in row]
