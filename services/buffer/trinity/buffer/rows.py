"""Rows of a task set or offline data: local files and folders read as plain dicts, filtered, cut to a limit.

JSONL is read line by line (each row exactly as written) and a Parquet file with pyarrow; JSON, CSV and Arrow files
and Hugging Face dataset folders (`data/train-00000-of-00001.parquet`, configs in subfolders, a README's `configs:`)
go through `datasets`' own builders, streamed, so nothing is cached and a `limit` stops the read early; a
`save_to_disk` directory is opened with `load_from_disk`. Every file read lies inside the data roots, the ones a
folder's README names included, and nothing is fetched from the network.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trinity.buffer.confinement import DataRoots
from trinity.config import OfflineDataConfig, TaskSetConfig
from trinity.config.buffer import RowFilter
from trinity.runtime.errors import InvalidArgument, PermissionDenied

Row = dict[str, Any]

FORMATS = ("jsonl", "json", "csv", "parquet", "arrow", "datasets")
FORMAT_OF_SUFFIX = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
}
SAVED_DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes
_MISSING = object()


def detect_format(path: Path, declared: str, field: str = "format") -> str:
    if declared:
        return declared
    if path.is_dir():
        return "datasets"
    kind = FORMAT_OF_SUFFIX.get(path.suffix.lower())
    if kind is None:
        raise InvalidArgument(
            field, f"cannot tell the format of {path.name!r}; set format to one of {', '.join(FORMATS)}"
        )
    return kind


def read_rows(source: TaskSetConfig | OfflineDataConfig, *, roots: DataRoots, where: str = "") -> list[Row]:
    """The rows of `source` (a task set's or offline data's section) that pass its filters, up to its limit.

    `where` prefixes the field an error names (`spec.` for a CreateTaskSet request).
    """
    path = roots.existing(source.path, where + "path")
    if path.is_dir():
        roots.check_tree(path, where + "path")
    kind = detect_format(path, source.format, where + "format")
    if kind not in FORMATS:
        raise InvalidArgument(where + "format", f"unknown format {kind!r}; known: {', '.join(FORMATS)}")
    if kind != "datasets" and path.is_dir():
        raise InvalidArgument(where + "format", f"{source.path!r} is a directory; its format is datasets")
    if kind == "datasets" and not path.is_dir():
        raise InvalidArgument(where + "format", f"{source.path!r} is a file; format datasets reads a directory")
    if source.subset and kind != "datasets":
        raise InvalidArgument(where + "subset", f"{path.name!r} is one file; subset picks a config of a dataset folder")
    if kind == "jsonl":
        rows: Iterator[Row] = _read_jsonl(path, where + "path")
    elif kind == "parquet":
        rows = _read_parquet(path)
    elif kind != "datasets":
        rows = _stream_builder(kind, [str(path)], "train", roots, where)
    elif any((path / marker).exists() for marker in SAVED_DATASET_MARKERS):
        rows = _read_saved(path, source, where)
    else:
        rows = _stream_builder(str(path), None, source.split, roots, where, subset=source.subset)
    return select_rows(_readable(rows, source.path, kind, where + "path"), source.filters, source.limit, where)


def lookup(row: Row, key: str) -> Any:
    """`a.b` reads nested fields; a missing key gives None."""
    value = _find(row, key)
    return None if value is _MISSING else value


def columns_of(row: Row | None) -> str:
    """The row's columns, for an error that names a missing one."""
    return ", ".join(sorted(row)) if row else "(no rows)"


# ---- filters ---------------------------------------------------------------------------------------


def select_rows(rows: Iterable[Row], filters: Sequence[RowFilter], limit: int, where: str = "") -> list[Row]:
    """The rows passing every filter, the first `limit` of them (0 = all); a filter's key no row has is an error."""
    tests = [_test(rule, f"{where}filters[{i}]") for i, rule in enumerate(filters)]
    found = [False] * len(filters)
    first: Row | None = None
    kept: list[Row] = []
    for number, row in enumerate(rows):
        first = row if first is None else first
        values = [_find(row, rule.key) for rule in filters]
        found = [seen or value is not _MISSING for seen, value in zip(found, values, strict=True)]
        if all(test(None if v is _MISSING else v, number) for test, v in zip(tests, values, strict=True)):
            kept.append(row)
            if limit and len(kept) >= limit:
                break
    for i, rule in enumerate(filters):
        if first is not None and not found[i]:
            raise InvalidArgument(
                f"{where}filters[{i}].key", f"{rule.key!r} is in no row; the rows have: {columns_of(first)}"
            )
    return kept


def _test(rule: RowFilter, field: str) -> Callable[[Any, int], bool]:
    """`rule` as a predicate over (the row's value, the row's number); null passes only ne and not_in."""
    op, want = rule.op, rule.value
    if op == "not_empty":
        return lambda value, _: not _empty(value)
    if op in ("ne", "not_in"):
        choices = want if isinstance(want, tuple) else (want,)
        return lambda value, _: not any(_equal(value, choice) for choice in choices)
    if op in ("eq", "in"):
        choices = want if isinstance(want, tuple) else (want,)
        return lambda value, _: any(_equal(value, choice) for choice in choices)
    if op in ("min_chars", "max_chars"):
        bound = int(want)  # type: ignore[arg-type]  # RowFilter checks: a whole number
        if op == "min_chars":
            return lambda value, _: value is not None and _chars(value) >= bound
        return lambda value, _: value is not None and _chars(value) <= bound
    compare: Callable[[Any, Any], bool] = {
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
    }[op]

    def ordered(value: Any, number: int) -> bool:
        if value is None:
            return False
        if _kind(value) is None or _kind(value) != _kind(want):
            raise InvalidArgument(
                field, f"row {number}: {rule.key!r} is {value!r}, which cannot be compared with {want!r}"
            )
        return compare(value, want)

    return ordered


def _equal(value: Any, choice: Any) -> bool:
    """JSON equality: true is not 1."""
    return isinstance(value, bool) == isinstance(choice, bool) and value == choice


def _kind(value: Any) -> str | None:
    """What `lt` / `gt` ... compare: numbers with numbers, texts with texts."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "number"
    return "text" if isinstance(value, str) else None


def _empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list | dict):
        return not value
    return False


def _chars(value: Any) -> int:
    """Characters of a text; a chat (a list of messages) counts its contents; anything else its JSON."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return sum(len(m.get("content") or "") if isinstance(m.get("content"), str | None) else 0 for m in value)
    return len(json.dumps(value))


def _find(row: Row, key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


# ---- readers ---------------------------------------------------------------------------------------


def _readable(rows: Iterator[Row], shown: str, kind: str, field: str) -> Iterator[Row]:
    """`rows`; a file that does not parse as `kind` is INVALID_ARGUMENT naming it, not an internal error."""
    import pyarrow as pa

    try:
        yield from rows
    except (ValueError, TypeError, OSError, pa.ArrowException) as err:  # what a malformed file raises
        raise InvalidArgument(field, f"{shown!r} cannot be read as {kind}: {err}") from None


def _read_jsonl(path: Path, field: str) -> Iterator[Row]:
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InvalidArgument(field, f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise InvalidArgument(field, f"{path}:{lineno}: each line must be a JSON object")
            yield row


def _read_parquet(path: Path) -> Iterator[Row]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches():
        yield from (_jsonable(r) for r in batch.to_pylist())


def _read_saved(path: Path, source: TaskSetConfig | OfflineDataConfig, where: str) -> Iterator[Row]:
    """A `save_to_disk` directory: one Dataset, or a DatasetDict whose `split` is read."""
    import datasets

    if source.subset:
        raise InvalidArgument(where + "subset", f"{source.path!r} is a save_to_disk directory, which has no configs")
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if source.split not in loaded:
            raise InvalidArgument(where + "split", f"{source.split!r} not in {path}; splits: {', '.join(loaded)}")
        loaded = loaded[source.split]
    for row in loaded:
        yield _jsonable(row)


def _stream_builder(
    dataset: str, data_files: list[str] | None, split: str, roots: DataRoots, where: str, subset: str = ""
) -> Iterator[Row]:
    """Rows of a `datasets` builder, streamed: a packaged one (`csv`, ...) over `data_files`, or a dataset folder's.

    The builder's cache (a lock file is all streaming writes) goes to a temporary directory, not the home folder.
    """
    import datasets

    if data_files is None:
        _check_folder_metadata(Path(dataset), where + "path")
    with tempfile.TemporaryDirectory(prefix="trinity-datasets-") as cache:
        try:
            builder = datasets.load_dataset_builder(
                dataset, name=subset or None, data_files=data_files, cache_dir=cache
            )
        except ValueError as err:  # a config name the folder does not have, or none where it has several
            raise InvalidArgument(where + "subset", f"{dataset}: {err}") from None
        except FileNotFoundError as err:  # no data files in the folder
            raise InvalidArgument(where + "path", f"{dataset}: {err}") from None
        splits = builder.config.data_files or {}
        for files in splits.values():
            for file in files:
                _check_data_file(str(file), roots, where + "path", dataset)
        if split not in splits:
            raise InvalidArgument(where + "split", f"{split!r} not in {dataset}; splits: {', '.join(splits)}")
        try:
            for row in builder.as_streaming_dataset(split=split):
                yield _jsonable(row)
        except datasets.exceptions.DatasetsError as err:  # a data file that does not parse
            raise InvalidArgument(where + "path", f"{dataset}: {err}") from None


def _check_folder_metadata(folder: Path, field: str) -> None:
    """A dataset folder reads only its own files: the `data_files` / `data_dir` its README's YAML (or a
    `.huggingface.yaml`) names stay inside it. Checked before `datasets` looks for them, which would tell whether a
    file outside the data roots exists."""
    import yaml
    from huggingface_hub import DatasetCard

    metadata: list[Any] = []
    try:
        if (folder / "README.md").is_file():
            metadata.append(DatasetCard.load(folder / "README.md").data.to_dict())
        if (folder / ".huggingface.yaml").is_file():
            metadata.append(yaml.safe_load((folder / ".huggingface.yaml").read_text(encoding="utf-8")))
    except (ValueError, yaml.YAMLError) as err:
        raise InvalidArgument(field, f"{folder}: the dataset card's YAML does not parse ({err})") from None
    for pattern in _strings_under(metadata, ("data_files", "data_dir")):
        normal = os.path.normpath(pattern)
        if "://" in pattern or os.path.isabs(pattern) or normal == ".." or normal.startswith("../"):
            raise PermissionDenied(
                f"{field}: {folder} names data files at {pattern!r}, outside the folder; a dataset folder is read "
                "only from its own files"
            )


def _strings_under(value: Any, keys: tuple[str, ...], inside: bool = False) -> Iterator[str]:
    """Every text in `value` under one of `keys` (at any depth)."""
    if isinstance(value, str) and inside:
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings_under(item, keys, inside or key in keys)
    elif isinstance(value, list):
        for item in value:
            yield from _strings_under(item, keys, inside)


def _check_data_file(file: str, roots: DataRoots, field: str, dataset: str) -> None:
    """A data file a folder names (its README may name any): a local file inside the data roots."""
    if "://" in file or not os.path.isabs(file):
        raise PermissionDenied(f"{field}: {dataset} names data file {file!r}; only local files are read")
    roots.resolve(file, field)


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
