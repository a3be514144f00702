"""The buffer section of the run config: task sets, offline data and the experience stream.

These are also the buffer's own configs: a `CreateTaskSet` / `CreateStream` / `LoadOfflineData` request
carries one of them (`trinity.config.spec` converts), so a knob set in YAML is the knob the buffer reads.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trinity.config.base import _check_name, _Section
from trinity.config.registered import OperatorName, RewardSpec, SelectorName

DataFormat = Literal["", "jsonl", "parquet", "datasets"]


class _DataFile(_Section):
    """Where rows come from: task sets and offline data read files the same way."""

    path: str = Field(
        min_length=1, description="JSONL or Parquet file, or a `datasets` directory; relative to the config file"
    )
    format: DataFormat = Field(default="", description="file format; empty = guessed from the path")
    split: str = Field(default="train", description="split of a `datasets` directory")


class TaskSetConfig(_DataFile):
    """A file of tasks the buffer hands out under leases (the gateway prefixes the name with run and stage)."""

    name: str = Field(default="train", description="task-set name, unique in the run")
    prompt_key: str = Field(default="prompt", description="row field (dotted path) holding the prompt or chat messages")
    answer_key: str = Field(default="answer", description="row field (dotted path) holding the reference answer")
    epochs: int = Field(default=1, ge=1, le=1_000_000, description="passes over the rows before the set is exhausted")
    selector: SelectorName = Field(default="sequential", description="order tasks are handed out in")
    seed: int = Field(default=0, description="seed of the shuffle / random / difficulty selectors")
    lease_seconds: float = Field(
        default=600.0, gt=0, le=86_400, description="a leased task not completed within this is handed out again"
    )
    reward_fn: RewardSpec = Field(
        default="", description="reward function of these tasks; empty = the workflow's default"
    )
    target_pass_rate: float = Field(
        default=0.5, ge=0, le=1, description="difficulty selector: prefer tasks whose pass rate is near this"
    )
    curriculum_temperature: float = Field(
        default=0.1, ge=0, description="difficulty selector: 0 = greedy, larger = more random"
    )
    limit: int = Field(default=0, ge=0, description="use only the first N rows; 0 = all")

    _name = field_validator("name")(_check_name)


class OfflineDataConfig(_DataFile):
    """SFT samples or DPO pairs loaded from a file into the training stream (train mode)."""

    prompt_key: str = Field(default="prompt", description="row field holding the prompt (SFT and DPO)")
    response_key: str = Field(default="response", description="SFT: row field holding the response")
    messages_key: str = Field(
        default="", description="SFT: row field holding a whole chat; set, it replaces prompt/response"
    )
    chosen_key: str = Field(default="chosen", description="DPO: row field holding the preferred response")
    rejected_key: str = Field(default="rejected", description="DPO: row field holding the rejected response")
    limit: int = Field(default=0, ge=0, description="use only the first N rows; 0 = all")


class OperatorConfig(_Section):
    """A data operator by registry name; `params` are numbers, `options` strings."""

    name: OperatorName = Field(description="registered operator, applied to every put in order")
    params: dict[str, float] = Field(default_factory=dict, description="numeric parameters of the operator")
    options: dict[str, str] = Field(default_factory=dict, description="text parameters of the operator")


class PriorityReplayConfig(_Section):
    """Re-deliver high-priority experiences instead of reading each once in order."""

    enabled: bool = Field(default=False, description="read by priority, re-using experiences")
    decay: float = Field(default=1.0, ge=0, description="priority multiplier applied on each re-use")
    use_limit: int = Field(default=1, ge=1, description="deliveries of one experience before it is retired")


class StreamConfig(_Section):
    """The stream explorers put experiences into and the trainer reads through a consumer group."""

    name: str = Field(default="experiences", description="stream name (the gateway prefixes it with run and stage)")
    group: str = Field(default="trainer", description="consumer group the trainer reads through")
    max_deliveries: int = Field(
        default=5, ge=1, le=1000, description="deliveries of an unacknowledged entry before it is dead-lettered"
    )
    claim_idle_ms: int = Field(
        default=600_000, ge=1, description="pending entries idle this long are reclaimed by the next reader"
    )
    dedupe_ttl_seconds: float = Field(
        default=86_400.0, gt=0, description="how long experience ids are remembered to drop duplicate puts"
    )
    operators: tuple[OperatorConfig, ...] = Field(default=(), description="data operators applied to every put")
    priority_replay: PriorityReplayConfig = Field(
        default=PriorityReplayConfig(), description="priority replay instead of in-order reads"
    )
    max_len: int = Field(
        default=0, ge=0, description="soft cap on entries; trimming never removes unacknowledged ones; 0 = none"
    )

    _name = field_validator("name", "group")(_check_name)


class BufferConfig(_Section):
    batch_size: int = Field(default=8, ge=1, description="tasks per explore step")
    train_batch_size: int | None = Field(
        default=None, ge=1, description="experiences per train step; None = batch_size * repeat_times"
    )
    total_steps: int = Field(default=10, ge=1, description="train steps (explore steps in explore mode)")
    taskset: TaskSetConfig | None = Field(default=None, description="the tasks to explore (modes both, explore)")
    eval_tasksets: tuple[TaskSetConfig, ...] = Field(
        default=(), description="tasks evaluated every eval_interval versions, in order, whole"
    )
    offline_data: OfflineDataConfig | None = Field(default=None, description="samples to train on (mode train)")
    experience_stream: StreamConfig = Field(default=StreamConfig(), description="where experiences go")
