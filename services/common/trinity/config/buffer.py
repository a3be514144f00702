"""Task sets and experience streams as configured in a run and as requested over gRPC."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

SelectorName = Literal["sequential", "shuffle", "random", "difficulty"]
DataFormat = Literal["", "jsonl", "parquet", "datasets"]


def _check_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 128 characters)")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskSetConfig(_Strict):
    name: str
    path: str = Field(min_length=1)
    format: DataFormat = ""
    split: str = "train"
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    epochs: int = Field(default=1, ge=1, le=1_000_000)
    selector: SelectorName = "sequential"
    seed: int = 0
    lease_seconds: float = Field(default=300.0, gt=0, le=86_400)
    workflow: str = ""
    reward_fn: str = ""
    target_pass_rate: float = Field(default=0.5, ge=0, le=1)
    curriculum_temperature: float = Field(default=0.1, ge=0)
    limit: int = Field(default=0, ge=0)

    _name = field_validator("name")(_check_name)


OperatorName = Literal["reward_filter", "reward_std_filter", "invalid_reward_filter", "reward_shaping", "pass_rate"]


class OperatorConfig(_Strict):
    """A data operator by registry name; `params` are numbers, `options` strings."""

    name: OperatorName
    params: dict[str, float] = Field(default_factory=dict)
    options: dict[str, str] = Field(default_factory=dict)


class PriorityReplayConfig(_Strict):
    enabled: bool = False
    decay: float = Field(default=1.0, ge=0)
    use_limit: int = Field(default=1, ge=1)


class StreamConfig(_Strict):
    name: str
    group: str = "trainer"
    max_deliveries: int = Field(default=5, ge=1, le=1000)
    claim_idle_ms: int = Field(default=30_000, ge=1)
    dedupe_ttl_seconds: float = Field(default=86_400.0, gt=0)
    operators: tuple[OperatorConfig, ...] = ()
    priority_replay: PriorityReplayConfig = PriorityReplayConfig()
    max_len: int = Field(default=0, ge=0)

    _name = field_validator("name", "group")(_check_name)
