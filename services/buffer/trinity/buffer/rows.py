"""Reading rows from JSONL, Parquet and local `datasets` directories (task sets and offline data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trinity.buffer.confinement import DataRoots
from trinity.runtime.errors import InvalidArgument

Row = dict[str, Any]


def detect_format(path: Path, declared: str) -> str:
    if declared:
        return declared
    if path.is_dir():
        return "datasets"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise InvalidArgument(
        "format", f"cannot tell the format of {path.name!r}; set format to jsonl, parquet or datasets"
    )


def read_rows(
    path_text: str, fmt: str = "", split: str = "train", limit: int = 0, field: str = "path", *, roots: DataRoots
) -> list[Row]:
    """All rows of a data file or directory inside the data roots as plain dicts (JSON-compatible values)."""
    path = roots.existing(path_text, field)
    if path.is_dir():
        roots.check_tree(path, field)
    kind = detect_format(path, fmt)
    if kind == "jsonl":
        rows = _read_jsonl(path, limit)
    elif kind == "parquet":
        rows = _read_parquet(path)
    elif kind == "datasets":
        rows = _read_datasets_dir(path, split)
    else:
        raise InvalidArgument("format", f"unknown format {kind!r}; known: jsonl, parquet, datasets")
    return rows[:limit] if limit else rows


def lookup(row: Row, key: str) -> Any:
    """`a.b` reads nested fields; a missing key gives None."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _read_jsonl(path: Path, limit: int) -> list[Row]:
    rows: list[Row] = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InvalidArgument("path", f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise InvalidArgument("path", f"{path}:{lineno}: each line must be a JSON object")
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    return rows


def _read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    return [_jsonable(r) for r in pq.read_table(path).to_pylist()]


def _read_datasets_dir(path: Path, split: str) -> list[Row]:
    """A `save_to_disk` directory (Dataset or DatasetDict), or a folder of JSONL / Parquet files."""
    saved_markers = ("dataset_info.json", "state.json", "dataset_dict.json")
    if any((path / m).exists() for m in saved_markers):
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise InvalidArgument("split", f"{split!r} not in {path}; splits: {', '.join(loaded)}")
            loaded = loaded[split]
        return [_jsonable(r) for r in loaded.to_list()]
    files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet") and split in p.stem) or sorted(
        p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet")
    )
    if not files:
        raise InvalidArgument("path", f"{path} holds no saved dataset and no .jsonl or .parquet files")
    rows: list[Row] = []
    for file in files:
        rows += _read_jsonl(file, 0) if file.suffix == ".jsonl" else _read_parquet(file)
    return rows


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return str(value)
