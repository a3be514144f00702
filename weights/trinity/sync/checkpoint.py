"""Checkpoint fallback: the trainer writes safetensors + a manifest to a shared directory; explorers poll it.

Layout under `<checkpoint_dir>/<group name>/`:

    v000000000007/model-00000.safetensors ...   one file per update() call (the chunk)
    v000000000007/manifest.json                 version, file checksums, tensor order
    LATEST                                      the newest complete version number

A version directory appears atomically (written as `.tmp-*`, fsynced, renamed), then LATEST is replaced
atomically, so a reader never sees a half-written version. A version directory is itself a Hugging Face
style weight directory: vLLM can `reload_weights(weights_path=...)` from it after verification.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from trinity.runtime.logging import get_logger
from trinity.sync.checksum import CHECKSUMS
from trinity.sync.errors import ChecksumMismatch, NoUpdateYet, StaleVersion, SyncError, as_sync_error
from trinity.sync.interface import NamedTensors, SyncReceiver, SyncReport, SyncSender, register_sync_backend
from trinity.sync.spec import SyncGroupSpec

log = get_logger("trinity.sync")
MANIFEST, LATEST, FORMAT = "manifest.json", "LATEST", "trinity-weights/1"


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:012d}"


def read_latest(root: Path) -> int | None:
    try:
        return int((root / LATEST).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checksum(name: str, data: bytes) -> int:
    return CHECKSUMS.get(name)(memoryview(data))


class CheckpointSender(SyncSender):
    """Writes each version as a directory of safetensors files; keeps the newest `keep` versions."""

    def __init__(self, spec: SyncGroupSpec, *, keep: int = 2) -> None:
        if spec.checkpoint_dir is None:
            raise ValueError("checkpoint_dir: required when backend is 'checkpoint'")
        self.spec, self.keep = spec, max(1, keep)
        self.root = Path(spec.checkpoint_dir) / spec.name
        self.last_version: int | None = None
        self._tmp: Path | None = None
        self._version: int | None = None
        self._files: list[dict[str, Any]] = []
        self._report: SyncReport | None = None
        self._started_at = 0.0

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.last_version = read_latest(self.root)  # a restarted trainer must not go backwards either

    def start(self, version: int) -> None:
        if self._version is not None:
            raise SyncError(f"version {self._version} is still open; finish() it before starting {version}")
        if self.last_version is not None and version <= self.last_version:
            raise StaleVersion(f"version {version} is not newer than the last published {self.last_version}")
        self._tmp = self.root / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
        self._tmp.mkdir(parents=True)
        self._version, self._files = version, []
        self._report = SyncReport(version=version)
        self._started_at = time.perf_counter()

    def update(self, named_tensors: NamedTensors) -> None:
        if self._tmp is None or self._report is None:
            raise SyncError("update() outside start()/finish()")
        with as_sync_error(f"checkpoint {self.root}: chunk {len(self._files)} of version {self._version}"):
            self._write_chunk(named_tensors, self._tmp, self._report)

    def _write_chunk(self, named_tensors: NamedTensors, tmp: Path, report: SyncReport) -> None:
        tensors: dict[str, torch.Tensor] = {}
        order, seen_storage = [], set()
        for name, tensor in named_tensors:
            t = tensor.detach().cpu().contiguous()
            # safetensors refuses tensors that share memory (tied embeddings): give the duplicate its own copy.
            key = (t.untyped_storage().data_ptr(), t.storage_offset())
            if key in seen_storage:
                t = t.clone()
            seen_storage.add(key)
            tensors[name] = t
            order.append(name)
        data = save_safetensors(tensors, metadata={"format": "pt"})
        file = f"model-{len(self._files):05d}.safetensors"
        (tmp / file).write_bytes(data)
        self._files.append(
            {"file": file, "bytes": len(data), "checksum": _checksum(self.spec.checksum, data), "names": order}
        )
        report.tensors += len(order)
        report.bytes += len(data)
        report.buckets += 1

    def finish(self, version: int) -> SyncReport:
        if self._version != version or self._tmp is None or self._report is None:
            raise SyncError(f"finish({version}) does not match the open version {self._version}")
        with as_sync_error(f"checkpoint {self.root}: finish of version {version}"):
            final = self._commit(version, self._tmp)
        report = self._report
        report.seconds, report.digest = time.perf_counter() - self._started_at, self.sent_digest()
        self.last_version, self._version, self._tmp, self._report = version, None, None, None
        self._prune()
        log.info("weights.published", group=self.spec.name, version=version, path=str(final), bytes=report.bytes)
        return report

    def _commit(self, version: int, tmp: Path) -> Path:
        """Manifest, fsync, rename into place, then LATEST: a reader sees the whole version or none of it."""
        manifest = {
            "format": FORMAT,
            "version": version,
            "checksum": self.spec.checksum,
            "digest": self.sent_digest(),
            "files": self._files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        for file in tmp.iterdir():
            _fsync(file)
        final = version_dir(self.root, version)
        os.rename(tmp, final)
        latest_tmp = self.root / f".{LATEST}.{uuid.uuid4().hex[:8]}"
        latest_tmp.write_text(f"{version}\n")
        _fsync(latest_tmp)
        os.replace(latest_tmp, self.root / LATEST)
        _fsync(self.root)
        return final

    def _prune(self) -> None:
        versions = sorted(p for p in self.root.glob("v" + "[0-9]" * 12) if p.is_dir())
        for old in versions[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def abandon(self, reason: str) -> None:
        # Readers never saw the temporary directory, so the next start() can simply begin again.
        log.warning("weights.abandoned", group=self.spec.name, version=self._version, reason=reason)
        self.close()

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp, self._version, self._report = None, None, None


class CheckpointReceiver(SyncReceiver):
    """Polls LATEST; loads the newest version newer than the one served and verifies every file."""

    def __init__(self, spec: SyncGroupSpec, rank: int, *, poll_interval_s: float = 0.05) -> None:
        if spec.checkpoint_dir is None:
            raise ValueError("checkpoint_dir: required when backend is 'checkpoint'")
        self.spec, self.rank, self.poll_interval_s = spec, rank, poll_interval_s
        self.root = Path(spec.checkpoint_dir) / spec.name
        self.version: int | None = None
        self.path: Path | None = None
        """The verified directory of the served version (for engines that load from a path)."""

    def init(self) -> None:
        pass

    def receive(self, idle_timeout_s: float | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        wait_s = self.spec.timeout_s if idle_timeout_s is None else idle_timeout_s
        deadline = time.monotonic() + wait_s
        while True:
            latest = read_latest(self.root)
            if latest is not None and (self.version is None or latest > self.version):
                try:
                    named, self.published_digest = self._load(latest)
                except FileNotFoundError:
                    continue  # pruned while we read it: a newer version is in LATEST now
                self.version, self.path = latest, version_dir(self.root, latest)
                log.info("weights.received", group=self.spec.name, rank=self.rank, version=latest, tensors=len(named))
                return latest, iter(named)
            if time.monotonic() >= deadline:
                raise NoUpdateYet(f"no new weight version in {self.root} within {wait_s}s (serving {self.version})")
            time.sleep(self.poll_interval_s)

    def _load(self, version: int) -> tuple[list[tuple[str, torch.Tensor]], int | None]:
        """The verified tensors of `version` and the digest its sender wrote (None from a sender without one)."""
        directory = version_dir(self.root, version)
        manifest = json.loads((directory / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("version") != version:
            raise SyncError(f"{directory / MANIFEST}: not a {FORMAT} manifest for version {version}")
        named: list[tuple[str, torch.Tensor]] = []
        for entry in manifest["files"]:
            data = (directory / entry["file"]).read_bytes()
            if len(data) != entry["bytes"] or _checksum(manifest["checksum"], data) != entry["checksum"]:
                log.error("weights.refused", group=self.spec.name, version=version, file=entry["file"])
                raise ChecksumMismatch(f"version {version}: {directory / entry['file']} fails its checksum; refused")
            tensors = load_safetensors(data)
            named.extend((name, tensors[name]) for name in entry["names"])
        return named, manifest.get("digest")

    def close(self) -> None:
        pass


register_sync_backend("checkpoint", CheckpointSender, CheckpointReceiver)
