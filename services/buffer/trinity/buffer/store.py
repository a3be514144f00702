"""The Buffer's state: streams and task sets, found by name, rebuilt from Redis after a restart."""

from __future__ import annotations

import threading
from typing import cast

import redis

from trinity.buffer.confinement import DataRoots
from trinity.buffer.keys import STREAMS, TASKSETS, MixtureKeys, StreamKeys, TaskSetKeys
from trinity.buffer.operators.registry import validate_operator
from trinity.buffer.rows import Row, read_rows
from trinity.buffer.streams.experience_stream import ExperienceStream
from trinity.buffer.tasksets.mixture import Mixture
from trinity.buffer.tasksets.reasoning_gym import generated_rows
from trinity.buffer.tasksets.taskset import TaskSet
from trinity.config import MixtureConfig, StreamConfig, TaskSetConfig
from trinity.runtime.errors import AlreadyExists, InvalidArgument, NotFound


class BufferStore:
    def __init__(self, client: redis.Redis, roots: DataRoots) -> None:
        self.client = client
        self.roots = roots
        self._streams: dict[str, ExperienceStream] = {}
        self._tasksets: dict[str, TaskSet] = {}
        self._mixtures: dict[str, Mixture] = {}
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
        if self.client.exists(MixtureKeys(config.name).spec):
            raise InvalidArgument("spec.name", f"{config.name!r} is a mixture; a task set needs a name of its own")
        with self._lock:
            existing = self.client.get(TaskSetKeys(config.name).spec)
            if existing is not None and not replace:
                current = TaskSetConfig.model_validate_json(existing)
                if current != config:
                    raise AlreadyExists(
                        f"task set {config.name!r} exists with a different spec; pass replace=true to reset it"
                    )
                return self._open_taskset(current)
            rows = self._rows(config)
            taskset = TaskSet(self.client, config, rows)
            taskset.save_spec(replace=True)
            self._tasksets[config.name] = taskset
            for name, mixture in list(self._mixtures.items()):  # reopened with the new member on their next use
                if any(m.taskset == config.name for m in mixture.config.members):
                    del self._mixtures[name]
            return taskset

    def taskset(self, name: str) -> TaskSet:
        cached = self._tasksets.get(name)
        if cached is not None:
            return cached
        raw = self.client.get(TaskSetKeys(name).spec)
        if raw is None:
            if self.client.exists(MixtureKeys(name).spec):
                raise InvalidArgument(
                    "taskset",
                    f"{name!r} is a mixture, not a task set: GetMixture describes it, and its tasks are completed "
                    "and renewed at their own task set (Task.taskset)",
                )
            raise NotFound(f"task set {name!r} does not exist; create it with CreateTaskSet")
        with self._lock:
            return self._open_taskset(TaskSetConfig.model_validate_json(raw))

    def _open_taskset(self, config: TaskSetConfig) -> TaskSet:
        taskset = self._tasksets.get(config.name)
        if taskset is None:
            # After a restart the rows are read again from the source; hand-out state lives in Redis.
            rows = self._rows(config)
            taskset = TaskSet(self.client, config, rows)
            self._tasksets[config.name] = taskset
        return taskset

    def _rows(self, config: TaskSetConfig) -> list[Row]:
        """The task set's rows: read from its file, or made by reasoning-gym's generators."""
        if config.source == "reasoning_gym":
            return generated_rows(config, where="spec.")
        return read_rows(config, roots=self.roots, where="spec.")

    def taskset_names(self) -> list[str]:
        return sorted(n.decode() for n in cast("set[bytes]", self.client.smembers(TASKSETS)))

    # ---- mixtures --------------------------------------------------------------------------------

    def create_mixture(self, config: MixtureConfig, replace: bool = False) -> Mixture:
        if self.client.exists(TaskSetKeys(config.name).spec):
            raise InvalidArgument("spec.name", f"{config.name!r} is a task set; a mixture needs a name of its own")
        members = [self._member(i, m.taskset) for i, m in enumerate(config.members)]
        with self._lock:
            existing = self.client.get(MixtureKeys(config.name).spec)
            if existing is not None and not replace:
                if MixtureConfig.model_validate_json(existing) != config:
                    raise AlreadyExists(
                        f"mixture {config.name!r} exists with a different spec; pass replace=true to start it again"
                    )
                cached = self._mixtures.get(config.name)
                if cached is not None:
                    return cached
            mixture = Mixture(self.client, config, members)
            if existing is None or replace:
                mixture.save_spec(replace=True)
            self._mixtures[config.name] = mixture
            return mixture

    def _member(self, index: int, name: str) -> TaskSet:
        field = f"spec.members[{index}].taskset"
        if self.client.exists(MixtureKeys(name).spec):
            raise InvalidArgument(field, f"{name!r} is a mixture; the members of a mixture are task sets")
        try:
            return self.taskset(name)
        except NotFound:
            raise InvalidArgument(field, f"no task set {name!r}; create it first (CreateTaskSet)") from None

    def mixture(self, name: str) -> Mixture:
        cached = self._mixtures.get(name)
        if cached is not None:
            return cached
        raw = self.client.get(MixtureKeys(name).spec)
        if raw is None:
            raise NotFound(f"mixture {name!r} does not exist; create it with CreateMixture")
        config = MixtureConfig.model_validate_json(raw)
        members = [self.taskset(m.taskset) for m in config.members]  # opens them (their rows) outside the lock
        with self._lock:
            return self._mixtures.setdefault(name, Mixture(self.client, config, members))

    def tasks_from(self, name: str) -> TaskSet | Mixture:
        """What LeaseTasks and ReleaseTasks take: a task set, or a mixture of them."""
        if name in self._tasksets or (name not in self._mixtures and self.client.exists(TaskSetKeys(name).spec)):
            return self.taskset(name)
        try:
            return self.mixture(name)
        except NotFound:
            raise NotFound(
                f"task set {name!r} does not exist; create it with CreateTaskSet (or a mixture with CreateMixture)"
            ) from None
