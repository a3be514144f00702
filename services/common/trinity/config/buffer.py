"""The buffer section of the run config: task sets, offline data and the experience stream.

These are also the buffer's own configs: a `CreateTaskSet` / `CreateStream` / `LoadOfflineData` request
carries one of them (`trinity.config.spec` converts), so a knob set in YAML is the knob the buffer reads.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trinity.config.base import _check_name, _Section
from trinity.config.registered import OperatorName, RewardSpec, SelectorName
from trinity.runtime.limits import MAX_TEXT_CHARS

# "datasets": a directory, either `save_to_disk` output or a Hugging Face dataset folder (as the Hub lays it out).
DataFormat = Literal["", "jsonl", "json", "csv", "parquet", "arrow", "datasets"]

# ---- rows: filters and prompt templates ------------------------------------------------------------

FilterOp = Literal["eq", "ne", "in", "not_in", "lt", "le", "gt", "ge", "not_empty", "min_chars", "max_chars"]
FilterScalar = bool | int | float | str
_NEEDS_LIST = ("in", "not_in")
_NEEDS_ORDERED = ("lt", "le", "gt", "ge")
_NEEDS_COUNT = ("min_chars", "max_chars")


def whole_numbers_to_ints(value: Any) -> Any:
    """2.0 -> 2 at any depth of JSON-like data: protobuf's Struct carries every number as a double."""
    if isinstance(value, dict):
        return {k: whole_numbers_to_ints(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [whole_numbers_to_ints(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class RowFilter(_Section):
    """Keep a row only when its field `key` passes `op`; a field the row lacks reads as null (no comparison
    holds for null, `ne` and `not_in` keep it)."""

    key: str = Field(min_length=1, description="row field (dotted path) the filter reads")
    op: FilterOp = Field(
        description="eq, ne: equal to value; in, not_in: among the values (a list); lt, le, gt, ge: compared "
        "with value (a number or text); not_empty: not null, blank text or an empty list (no value); "
        "min_chars, max_chars: characters of the field (a chat counts its contents) against value"
    )
    value: FilterScalar | tuple[FilterScalar, ...] | None = Field(default=None, description="what `op` compares with")

    _whole = field_validator("value", mode="before")(whole_numbers_to_ints)

    @model_validator(mode="after")
    def _value_fits_op(self) -> RowFilter:
        value, op = self.value, self.op
        if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, tuple) else [value])):
            raise ValueError(f"value {value!r}: numbers must be finite")
        if op in _NEEDS_LIST:
            if not isinstance(value, tuple) or not value:
                raise ValueError(f"op {op!r} needs a list of values, e.g. value: [1, 2]")
        elif op == "not_empty":
            if value is not None:
                raise ValueError("op 'not_empty' takes no value")
        elif op in _NEEDS_COUNT:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"op {op!r} needs a whole number of characters >= 0, e.g. value: 2000")
        elif isinstance(value, tuple) or value is None:
            raise ValueError(f"op {op!r} needs one value (a number, text or true/false), got {value!r}")
        elif op in _NEEDS_ORDERED and isinstance(value, bool):
            raise ValueError(f"op {op!r} compares numbers or text, not true/false")
        return self


def template_columns(text: str) -> list[str]:
    """The row columns a `str.format` template names (`{question}`, `{meta[level]}` -> question, meta).

    ValueError for what `format_map` over a row cannot fill: unbalanced braces, `{}` / `{0}` (no column),
    `{a.b}` (attribute access), a field inside a format spec.
    """
    columns: list[str] = []
    for _, field, spec, _ in string.Formatter().parse(text):  # ValueError on unbalanced braces
        if field is None:
            continue
        column = re.match(r"[^.\[]*", field).group()  # type: ignore[union-attr]  # matches at least ""
        if not column or column.isdigit() or column != column.strip() or column[0] in "\"'":
            raise ValueError(
                f"{{{field}}} names no column; write the row's column in braces, e.g. {{question}}, and a literal "
                "brace twice: {{ or }}"
            )
        if "." in re.sub(r"\[[^\]]*\]", "", field[len(column) :]):
            raise ValueError(f"{{{field}}}: attribute access is not supported; index nested fields: {{meta[level]}}")
        if spec and "{" in spec:
            raise ValueError(f"{{{field}:{spec}}}: a field inside a format spec is not supported")
        columns.append(column)
    return columns


class FewShotExample(_Section):
    """One worked example shown before the task: used as written (not a format string)."""

    prompt: str = Field(max_length=MAX_TEXT_CHARS, description="the example's question (a user turn in chat)")
    answer: str = Field(max_length=MAX_TEXT_CHARS, description="its answer (an assistant turn in chat)")


class PromptTemplate(_Section):
    """Build each task's prompt from its row: a system prompt, few-shot examples, then the row's own question."""

    format: Literal["chat", "raw"] = Field(
        default="chat",
        description="chat: Task.messages (system, example user/assistant turns, user); raw: one Task.prompt text, "
        "the same parts joined by blank lines (an example is its prompt, a newline, its answer)",
    )
    system_prompt: str = Field(default="", max_length=MAX_TEXT_CHARS, description="empty = none")
    few_shot: tuple[FewShotExample, ...] = Field(default=(), description="examples shown before the task, in order")
    prompt: str = Field(
        default="",
        max_length=MAX_TEXT_CHARS,
        description="format string over the row's columns (`Question: {question}`, `{meta[level]}`; `{{` is a "
        "brace); empty = the prompt_key field as is (text, or in chat format a list of messages)",
    )

    @field_validator("prompt")
    @classmethod
    def _fills_from_columns(cls, value: str) -> str:
        template_columns(value)
        return value


class _DataFile(_Section):
    """Where rows come from: task sets and offline data read files the same way."""

    path: str = Field(
        min_length=1,
        description="a JSONL, JSON, CSV, Parquet or Arrow file, a `save_to_disk` directory or a Hugging Face dataset "
        "folder; relative to the config file",
    )
    format: DataFormat = Field(default="", description="file format; empty = from the suffix (a directory: datasets)")
    split: str = Field(default="train", description="split of a directory (a dataset folder or save_to_disk output)")
    subset: str = Field(
        default="", description="config (subset) of a Hugging Face dataset folder (`main`); empty = its default"
    )
    filters: tuple[RowFilter, ...] = Field(
        default=(), description="keep only the rows that pass every filter (applied before limit)"
    )


TaskSource = Literal["file", "reasoning_gym"]
_RG_SET_BY_THE_TASK_SET = ("seed", "size")


class ReasoningGymGenerator(_Section):
    """One reasoning-gym generator of a task set: its name, its share of the rows, its config."""

    name: str = Field(min_length=1, description="reasoning-gym dataset name (basic_arithmetic, leg_counting, ...)")
    weight: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="share of the rows, normalized over the generators"
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="fields of the generator's config dataclass ({min_terms: 2}); whole numbers are passed as ints; "
        "seed and size come from the task set",
    )

    _whole = field_validator("config", mode="before")(whole_numbers_to_ints)

    @field_validator("config")
    @classmethod
    def _no_seed_or_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in _RG_SET_BY_THE_TASK_SET:
            if key in value:
                raise ValueError(f"{key!r}: set reasoning_gym.{key} instead; each generator's {key} derives from it")
        return value


class ReasoningGymConfig(_Section):
    """Tasks generated by reasoning-gym's generators, mixed by weight (its composite dataset); deterministic given
    seed and size. Generator k makes row i from the seed `seed + k + 1 + i`, so two sets with a generator in common
    share rows unless their seeds lie at least size + the number of generators apart."""

    size: int = Field(default=500, ge=1, le=1_000_000, description="rows generated")
    seed: int = Field(default=0, ge=0, description="seed of the rows (a held-out set takes another, far enough away)")
    generators: tuple[ReasoningGymGenerator, ...] = Field(
        min_length=1, description="the generators mixed, each once (names are checked by the buffer)"
    )

    @field_validator("generators")
    @classmethod
    def _each_once(cls, value: tuple[ReasoningGymGenerator, ...]) -> tuple[ReasoningGymGenerator, ...]:
        names = [g.name for g in value]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"generators[{i}]: {name!r} is listed twice; list each generator once")
        return value

    def seeds_shared_with(self, other: ReasoningGymConfig) -> bool:
        """Whether the two sets have a generator (same name and config) whose row seeds overlap."""
        for k, mine in enumerate(self.generators):
            for j, theirs in enumerate(other.generators):
                if (mine.name, mine.config) != (theirs.name, theirs.config):
                    continue
                start, other_start = self.seed + k + 1, other.seed + j + 1
                if start < other_start + other.size and other_start < start + self.size:
                    return True
        return False


class TaskSetConfig(_DataFile):
    """Tasks the buffer hands out under leases (the gateway prefixes the name with run and stage): the rows of a
    file, or rows that reasoning-gym's generators make."""

    name: str = Field(default="train", description="task-set name, unique in the run")
    # Where the rows come from; the file fields (path, format, split, subset) are for source file.
    source: TaskSource = Field(
        default="file", description="file: the rows of path; reasoning_gym: rows made by reasoning-gym's generators"
    )
    path: str = Field(
        default="",
        description="source file (required): a JSONL, JSON, CSV, Parquet or Arrow file, a `save_to_disk` directory "
        "or a Hugging Face dataset folder; relative to the config file. Unset for source reasoning_gym",
    )
    reasoning_gym: ReasoningGymConfig | None = Field(
        default=None,
        description="source reasoning_gym (required): generators, seed and size; rows {question, answer, metadata}, "
        "prompt_key defaults to question and reward_fn to reasoning_gym",
    )
    prompt_key: str = Field(default="prompt", description="row field (dotted path) holding the prompt or chat messages")
    answer_key: str = Field(default="answer", description="row field (dotted path) holding the reference answer")
    reward_fn_key: str = Field(
        default="", description="row field naming the row's reward function; empty in a row (or unset) = reward_fn"
    )
    workflow_key: str = Field(
        default="", description="row field naming the row's workflow (Task.workflow); empty = the run's workflow"
    )
    template: PromptTemplate | None = Field(
        default=None, description="build the prompt from the row's columns; None = the prompt_key field as is"
    )
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
    # Mixing: the set's share of a run's train batches (buffer.tasksets, buffer.mixing).
    weight: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="train task sets, mixing.strategy fixed: share of each batch (normalized over the sets); None = 1",
    )

    _name = field_validator("name")(_check_name)

    @model_validator(mode="before")
    @classmethod
    def _generated_defaults(cls, data: Any) -> Any:
        """Generated rows are reasoning-gym entries: the prompt is their question, their own scoring the reward."""
        if isinstance(data, dict) and data.get("source") == "reasoning_gym":
            data = {**data, "prompt_key": data.get("prompt_key") or "question"}
            data["reward_fn"] = data.get("reward_fn") or "reasoning_gym"
        return data

    @model_validator(mode="after")
    def _source_fields(self) -> TaskSetConfig:
        if self.source == "file":
            if not self.path:
                raise ValueError("path: source file reads its rows from path; set it (or source: reasoning_gym)")
            if self.reasoning_gym is not None:
                raise ValueError("reasoning_gym: only source reasoning_gym reads it; set source: reasoning_gym")
        else:
            if self.reasoning_gym is None:
                raise ValueError("reasoning_gym: source reasoning_gym needs it (generators, seed, size)")
            for key in ("path", "format", "subset"):
                if getattr(self, key):
                    raise ValueError(f"{key}: source reasoning_gym generates its rows and reads no file; remove {key}")
        return self


MixingStrategy = Literal["fixed", "proportional", "temperature"]


class MixingConfig(_Section):
    """How several train task sets (`buffer.tasksets`) share each batch: the buffer draws every task's set at random
    with these shares (seeded; the draw count lives in Redis, so restarts and several explorers follow one sequence).
    A set that has nothing to hand out is left out of the draws and the others' shares grow to fill its place."""

    strategy: MixingStrategy = Field(
        default="fixed",
        description="fixed = the sets' weights, normalized; proportional = by size (rows x epochs); "
        "temperature = size^(1/temperature), normalized",
    )
    temperature: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="strategy temperature: 1 = proportional, larger = more even"
    )
    seed: int = Field(default=0, description="seed of the draws")


class MixtureMember(_Section):
    """A task set of a mixture and its weight (strategy fixed; None = 1)."""

    taskset: str = Field(description="the member task set's buffer name")
    weight: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="share before normalizing")

    _taskset = field_validator("taskset")(_check_name)


class MixtureConfig(_Section):
    """A mixture the buffer hands tasks out from (`CreateMixture`): each task of a leased batch comes from a member
    drawn with the mixing shares. The gateway makes a run's from `buffer.tasksets` and `buffer.mixing`."""

    name: str = Field(description="the mixture's name; LeaseTasks takes it where it takes a task set's")
    members: tuple[MixtureMember, ...] = Field(min_length=1, description="the task sets mixed, each once")
    mixing: MixingConfig = Field(default=MixingConfig(), description="how the members' shares are computed")

    _name = field_validator("name")(_check_name)

    @model_validator(mode="after")
    def _members(self) -> MixtureConfig:
        members = [(f"members[{i}]", m.taskset, m.weight) for i, m in enumerate(self.members)]
        _check_members("members", members, self.mixing.strategy)
        return self


def _check_members(field: str, members: Sequence[tuple[str, str, float | None]], strategy: str) -> None:
    """ValueError naming the key when a member (its key, name, weight) repeats, has a weight the strategy does not
    read, or every weight is 0: the checks of a mixture, for `buffer.tasksets` and for a buffer request alike."""
    first: dict[str, str] = {}
    for key, name, weight in members:
        if name in first:
            raise ValueError(f"{key}: task set {name!r} is listed twice (also {first[name]}); each is mixed once")
        first[name] = key
        if weight is not None and strategy != "fixed":
            raise ValueError(
                f"{key}.weight: mixing.strategy {strategy!r} shares by size and reads no weights; "
                "remove the weight, or use strategy 'fixed'"
            )
    if strategy == "fixed" and members and not any(1.0 if w is None else w for _, _, w in members):
        raise ValueError(f"{field}: every weight is 0; give at least one task set a positive weight")


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
        default=86_400.0,
        gt=0,
        allow_inf_nan=False,
        description="how long experience ids are remembered to drop duplicate puts",
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
    tasksets: tuple[TaskSetConfig, ...] = Field(
        default=(), description="several task sets to explore, mixed in every batch (mixing); instead of taskset"
    )
    mixing: MixingConfig = Field(default=MixingConfig(), description="how the tasksets share each batch")
    eval_tasksets: tuple[TaskSetConfig, ...] = Field(
        default=(), description="tasks evaluated every eval_interval versions, in order, whole"
    )
    offline_data: OfflineDataConfig | None = Field(default=None, description="samples to train on (mode train)")
    experience_stream: StreamConfig = Field(default=StreamConfig(), description="where experiences go")

    @model_validator(mode="after")
    def _train_tasksets(self) -> BufferConfig:
        if self.taskset is not None and self.tasksets:
            raise ValueError(
                "tasksets: set either taskset (one task set) or tasksets (several, mixed), not both; a stage that "
                "switches from one to the other sets the other to null"
            )
        if self.tasksets:
            members = [(f"tasksets[{i}]", t.name, t.weight) for i, t in enumerate(self.tasksets)]
            _check_members("tasksets", members, self.mixing.strategy)
        elif self.taskset is not None:
            _check_members("taskset", [("taskset", self.taskset.name, self.taskset.weight)], self.mixing.strategy)
        for i, section in enumerate(self.eval_tasksets):
            if section.weight is not None:
                raise ValueError(f"eval_tasksets[{i}].weight: only train task sets are mixed; remove the weight")
        return self

    @model_validator(mode="after")
    def _held_out_generated_sets(self) -> BufferConfig:
        """A generated eval set must not share rows with a generated train set (see ReasoningGymConfig)."""
        for i, held_out in enumerate(self.eval_tasksets):
            for train in self.train_tasksets:
                if held_out.reasoning_gym is None or train.reasoning_gym is None:
                    continue
                if held_out.reasoning_gym.seeds_shared_with(train.reasoning_gym):
                    far = train.reasoning_gym.seed + train.reasoning_gym.size + len(train.reasoning_gym.generators)
                    raise ValueError(
                        f"eval_tasksets[{i}].reasoning_gym.seed: {held_out.reasoning_gym.seed} makes rows of the train "
                        f"task set {train.name!r} (a generator's row i is seeded seed + its position + 1 + i); take "
                        f"a seed of at least {far} (or one low enough that its rows end before the train set's begin)"
                    )
        return self

    @property
    def train_tasksets(self) -> tuple[TaskSetConfig, ...]:
        """The task sets explored: `tasksets`, or `taskset` as a mixture of one, or none."""
        return self.tasksets or ((self.taskset,) if self.taskset is not None else ())
