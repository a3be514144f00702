"""Offline data: SFT samples and DPO pairs from files into a stream; any stream out to JSONL or SQLite."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from trinity.buffer.confinement import DataRoots
from trinity.buffer.rows import Row, lookup, read_rows
from trinity.config import OfflineDataConfig
from trinity.runtime.errors import AlreadyExists, InvalidArgument, PermissionDenied
from trinity.v1 import common_pb2

SFT = common_pb2.EXPERIENCE_KIND_SFT
PREFERENCE = common_pb2.EXPERIENCE_KIND_PREFERENCE


def offline_experiences(
    config: OfflineDataConfig, kind: common_pb2.ExperienceKind, roots: DataRoots
) -> tuple[list[common_pb2.Experience], int]:
    """Rows -> text-level experiences (the Trainer tokenizes them with its model's chat template).

    Ids are content hashes, so loading the same file twice adds nothing (the stream drops duplicates).
    Returns (experiences, rows skipped because a mapped field was missing).
    """
    if kind not in (SFT, PREFERENCE):
        raise InvalidArgument("kind", "must be EXPERIENCE_KIND_SFT or EXPERIENCE_KIND_PREFERENCE")
    rows = read_rows(config, roots=roots)
    build = _sft if kind == SFT else _preference
    out: list[common_pb2.Experience] = []
    skipped = 0
    for row in rows:
        exp = build(row, config)
        if exp is None:
            skipped += 1
            continue
        exp.kind = kind
        exp.id = "offline-" + hashlib.sha1(exp.SerializeToString(deterministic=True)).hexdigest()
        out.append(exp)
    return out, skipped


def _sft(row: Row, config: OfflineDataConfig) -> common_pb2.Experience | None:
    exp = common_pb2.Experience()
    if config.messages_key:
        messages = lookup(row, config.messages_key)
        if not isinstance(messages, list) or not messages:
            return None
        _add_messages(exp, messages)
        return exp
    prompt = lookup(row, config.prompt_key)
    response = lookup(row, config.response_key)
    if prompt is None or response is None:
        return None
    _set_prompt(exp, prompt)
    exp.response_text = _text(response)
    return exp


def _preference(row: Row, config: OfflineDataConfig) -> common_pb2.Experience | None:
    prompt = lookup(row, config.prompt_key)
    chosen = lookup(row, config.chosen_key)
    rejected = lookup(row, config.rejected_key)
    if prompt is None or chosen is None or rejected is None:
        return None
    exp = common_pb2.Experience()
    _set_prompt(exp, prompt)
    exp.response_text = _last_content(chosen)
    exp.preference.rejected_text = _last_content(rejected)
    return exp


def _set_prompt(exp: common_pb2.Experience, prompt: Any) -> None:
    if isinstance(prompt, list):
        _add_messages(exp, prompt)
    else:
        exp.prompt_text = _text(prompt)


def _add_messages(exp: common_pb2.Experience, messages: list[Any]) -> None:
    for m in messages:
        if isinstance(m, dict):
            exp.messages.add(role=str(m.get("role", "user")), content=_text(m.get("content", "")))


def _last_content(value: Any) -> str:
    """A response given as a chat (list of messages) contributes its last message's content."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return _text(value[-1].get("content", ""))
    return _text(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def export_entries(
    entries: Iterable[tuple[str, bytes]], path: str, fmt: str, *, roots: DataRoots, overwrite: bool = False
) -> int:
    """Write (entry id, serialized Experience) pairs to JSONL or SQLite inside the data roots; returns how many.

    An existing file is replaced only when `overwrite` says so.
    """
    target = roots.resolve(path, "path")
    fmt = fmt or ("sqlite" if target.suffix in (".db", ".sqlite", ".sqlite3") else "jsonl")
    if fmt not in ("jsonl", "sqlite"):
        raise InvalidArgument("format", f"unknown export format {fmt!r}; known: jsonl, sqlite")
    if not target.parent.is_dir():
        raise InvalidArgument("path", f"the directory of {path!r} does not exist on the buffer's machine")
    descriptor = _create(target, path, overwrite)
    count = 0
    if fmt == "jsonl":
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            for entry_id, payload in entries:
                record = _as_dict(payload)
                record["entry_id"] = entry_id
                handle.write(json.dumps(record) + "\n")
                count += 1
        return count
    os.close(descriptor)  # an empty file: SQLite makes it a new database
    with sqlite3.connect(target) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS experiences (entry_id TEXT PRIMARY KEY, id TEXT, kind TEXT, "
            "task_id TEXT, group_id TEXT, model_version INTEGER, reward REAL, json TEXT)"
        )
        for entry_id, payload in entries:
            record = _as_dict(payload)
            db.execute(
                "INSERT OR REPLACE INTO experiences VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry_id,
                    record.get("id", ""),
                    record.get("kind", ""),
                    record.get("task_id", ""),
                    record.get("group_id", ""),
                    int(record.get("model_version", 0)),
                    float(record.get("reward", 0.0)),
                    json.dumps(record),
                ),
            )
            count += 1
    return count


def _create(target: Path, shown: str, overwrite: bool) -> int:
    """Open the export file for writing, never through a symlink (one swapped in after the path was resolved
    is refused) and, without `overwrite`, only if it is new."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        return os.open(target, flags, 0o644)
    except FileExistsError:
        raise AlreadyExists(f"path: {shown!r} exists; set overwrite to replace it") from None
    except IsADirectoryError:
        raise InvalidArgument("path", f"{shown!r} is a directory; name a file in it") from None
    except PermissionError:
        raise PermissionDenied(f"path: the buffer may not write {shown!r} (a read-only mount?)") from None
    except OSError as err:  # ELOOP: the last component became a symlink
        raise PermissionDenied(f"path: {shown!r} cannot be written ({err.strerror})") from None


def _as_dict(payload: bytes) -> dict[str, Any]:
    exp = common_pb2.Experience.FromString(payload)
    return json_format.MessageToDict(exp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
