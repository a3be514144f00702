"""The Buffer's state: streams and task sets, found by name, rebuilt from Redis after a restart."""

from __future__ import annotations

import threading
from typing import cast

import redis

from trinity.buffer.confinement import DataRoots
from trinity.buffer.keys import STREAMS, TASKSETS, StreamKeys, TaskSetKeys
from trinity.buffer.operators.registry import validate_operator
from trinity.buffer.rows import read_rows
from trinity.buffer.streams.experience_stream import ExperienceStream
from trinity.buffer.tasksets.taskset import TaskSet
from trinity.config import StreamConfig, TaskSetConfig
from trinity.runtime.errors import AlreadyExists, InvalidArgument, NotFound


class BufferStore:
    def __init__(self, client: redis.Redis, roots: DataRoots) -> None:
        self.client = client
        self.roots = roots
        self._streams: dict[str, ExperienceStream] = {}
        self._tasksets: dict[str, TaskSet] = {}
        self._lock = threading.Lock()

    # ---- streams ---------------------------------------------------------------------------------

    def create_stream(self, config: StreamConfig, exist_ok: bool = False) -> ExperienceStream:
        for i, op in enumerate(config.operators):
            try:
                validate_operator(op)
            except (KeyError, ValueError) as err:
                raise InvalidArgument(f"spec.operators[{i}]", str(err).strip('"')) from None
        with self._lock:
            existing = self.client.get(StreamKeys(config.name).spec)
            if existing is not None:
                current = StreamConfig.model_validate_json(existing)
                if current != config and not exist_ok:
                    raise AlreadyExists(f"stream {config.name!r} already exists with a different spec")
                return self._open_stream(current)
            stream = ExperienceStream(self.client, config)
            stream.create()
            self._streams[config.name] = stream
            return stream

    def stream(self, name: str) -> ExperienceStream:
        cached = self._streams.get(name)
        if cached is not None:
            return cached
        raw = self.client.get(StreamKeys(name).spec)
        if raw is None:
            raise NotFound(f"stream {name!r} does not exist; create it with CreateStream")
        with self._lock:
            return self._open_stream(StreamConfig.model_validate_json(raw))

    def _open_stream(self, config: StreamConfig) -> ExperienceStream:
        stream = self._streams.get(config.name)
        if stream is None:
            stream = ExperienceStream(self.client, config)
            self._streams[config.name] = stream
        return stream

    def stream_names(self) -> list[str]:
        return sorted(n.decode() for n in cast("set[bytes]", self.client.smembers(STREAMS)))

    def delete_stream(self, name: str) -> bool:
        stream = self.stream(name)
        stream.delete()
        self._streams.pop(name, None)
        return True

    # ---- task sets -------------------------------------------------------------------------------

    def create_taskset(self, config: TaskSetConfig, replace: bool = False) -> TaskSet:
        with self._lock:
            existing = self.client.get(TaskSetKeys(config.name).spec)
            if existing is not None and not replace:
                current = TaskSetConfig.model_validate_json(existing)
                if current != config:
                    raise AlreadyExists(
                        f"task set {config.name!r} exists with a different spec; pass replace=true to reset it"
                    )
                return self._open_taskset(current)
            rows = read_rows(config.path, config.format, config.split, config.limit, "spec.path", roots=self.roots)
            taskset = TaskSet(self.client, config, rows)
            taskset.save_spec(replace=True)
            self._tasksets[config.name] = taskset
            return taskset

    def taskset(self, name: str) -> TaskSet:
        cached = self._tasksets.get(name)
        if cached is not None:
            return cached
        raw = self.client.get(TaskSetKeys(name).spec)
        if raw is None:
            raise NotFound(f"task set {name!r} does not exist; create it with CreateTaskSet")
        with self._lock:
            return self._open_taskset(TaskSetConfig.model_validate_json(raw))

    def _open_taskset(self, config: TaskSetConfig) -> TaskSet:
        taskset = self._tasksets.get(config.name)
        if taskset is None:
            # After a restart the rows are read again from the source; hand-out state lives in Redis.
            rows = read_rows(config.path, config.format, config.split, config.limit, "spec.path", roots=self.roots)
            taskset = TaskSet(self.client, config, rows)
            self._tasksets[config.name] = taskset
        return taskset

    def taskset_names(self) -> list[str]:
        return sorted(n.decode() for n in cast("set[bytes]", self.client.smembers(TASKSETS)))
