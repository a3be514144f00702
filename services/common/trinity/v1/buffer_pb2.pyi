from google.protobuf import struct_pb2 as _struct_pb2
from trinity.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskSetSpec(_message.Message):
    __slots__ = ("name", "path", "format", "split", "prompt_key", "answer_key", "epochs", "selector", "seed", "lease_seconds", "workflow", "reward_fn", "target_pass_rate", "curriculum_temperature", "limit", "subset", "filters", "reward_fn_key", "workflow_key", "template", "weight", "source", "reasoning_gym")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    ANSWER_KEY_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    REWARD_FN_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASS_RATE_FIELD_NUMBER: _ClassVar[int]
    CURRICULUM_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FN_KEY_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_KEY_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASONING_GYM_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    format: str
    split: str
    prompt_key: str
    answer_key: str
    epochs: int
    selector: str
    seed: int
    lease_seconds: float
    workflow: str
    reward_fn: str
    target_pass_rate: float
    curriculum_temperature: float
    limit: int
    subset: str
    filters: _containers.RepeatedCompositeFieldContainer[RowFilter]
    reward_fn_key: str
    workflow_key: str
    template: PromptTemplate
    weight: float
    source: str
    reasoning_gym: ReasoningGymSpec
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., format: _Optional[str] = ..., split: _Optional[str] = ..., prompt_key: _Optional[str] = ..., answer_key: _Optional[str] = ..., epochs: _Optional[int] = ..., selector: _Optional[str] = ..., seed: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., workflow: _Optional[str] = ..., reward_fn: _Optional[str] = ..., target_pass_rate: _Optional[float] = ..., curriculum_temperature: _Optional[float] = ..., limit: _Optional[int] = ..., subset: _Optional[str] = ..., filters: _Optional[_Iterable[_Union[RowFilter, _Mapping]]] = ..., reward_fn_key: _Optional[str] = ..., workflow_key: _Optional[str] = ..., template: _Optional[_Union[PromptTemplate, _Mapping]] = ..., weight: _Optional[float] = ..., source: _Optional[str] = ..., reasoning_gym: _Optional[_Union[ReasoningGymSpec, _Mapping]] = ...) -> None: ...

class ReasoningGymSpec(_message.Message):
    __slots__ = ("size", "seed", "generators")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GENERATORS_FIELD_NUMBER: _ClassVar[int]
    size: int
    seed: int
    generators: _containers.RepeatedCompositeFieldContainer[ReasoningGymGenerator]
    def __init__(self, size: _Optional[int] = ..., seed: _Optional[int] = ..., generators: _Optional[_Iterable[_Union[ReasoningGymGenerator, _Mapping]]] = ...) -> None: ...

class ReasoningGymGenerator(_message.Message):
    __slots__ = ("name", "weight", "config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    config: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class RowFilter(_message.Message):
    __slots__ = ("key", "op", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    op: str
    value: _struct_pb2.Value
    def __init__(self, key: _Optional[str] = ..., op: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class PromptTemplate(_message.Message):
    __slots__ = ("format", "system_prompt", "few_shot", "prompt")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    FEW_SHOT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    format: str
    system_prompt: str
    few_shot: _containers.RepeatedCompositeFieldContainer[FewShotExample]
    prompt: str
    def __init__(self, format: _Optional[str] = ..., system_prompt: _Optional[str] = ..., few_shot: _Optional[_Iterable[_Union[FewShotExample, _Mapping]]] = ..., prompt: _Optional[str] = ...) -> None: ...

class FewShotExample(_message.Message):
    __slots__ = ("prompt", "answer")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    answer: str
    def __init__(self, prompt: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class TaskSetInfo(_message.Message):
    __slots__ = ("spec", "size", "total_tasks", "handed_out", "completed", "leased", "epoch", "exhausted", "failed")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TASKS_FIELD_NUMBER: _ClassVar[int]
    HANDED_OUT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSetSpec
    size: int
    total_tasks: int
    handed_out: int
    completed: int
    leased: int
    epoch: int
    exhausted: bool
    failed: int
    def __init__(self, spec: _Optional[_Union[TaskSetSpec, _Mapping]] = ..., size: _Optional[int] = ..., total_tasks: _Optional[int] = ..., handed_out: _Optional[int] = ..., completed: _Optional[int] = ..., leased: _Optional[int] = ..., epoch: _Optional[int] = ..., exhausted: _Optional[bool] = ..., failed: _Optional[int] = ...) -> None: ...

class CreateTaskSetRequest(_message.Message):
    __slots__ = ("spec", "replace")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSetSpec
    replace: bool
    def __init__(self, spec: _Optional[_Union[TaskSetSpec, _Mapping]] = ..., replace: _Optional[bool] = ...) -> None: ...

class GetTaskSetRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListTaskSetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTaskSetsResponse(_message.Message):
    __slots__ = ("tasksets",)
    TASKSETS_FIELD_NUMBER: _ClassVar[int]
    tasksets: _containers.RepeatedCompositeFieldContainer[TaskSetInfo]
    def __init__(self, tasksets: _Optional[_Iterable[_Union[TaskSetInfo, _Mapping]]] = ...) -> None: ...

class LeaseTasksRequest(_message.Message):
    __slots__ = ("taskset", "consumer", "batch_size", "lease_seconds")
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    taskset: str
    consumer: str
    batch_size: int
    lease_seconds: float
    def __init__(self, taskset: _Optional[str] = ..., consumer: _Optional[str] = ..., batch_size: _Optional[int] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class LeaseTasksResponse(_message.Message):
    __slots__ = ("tasks", "exhausted")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Task]
    exhausted: bool
    def __init__(self, tasks: _Optional[_Iterable[_Union[_common_pb2.Task, _Mapping]]] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("lease_id", "task_id", "pass_rate", "samples", "failed")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PASS_RATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    pass_rate: float
    samples: int
    failed: bool
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., pass_rate: _Optional[float] = ..., samples: _Optional[int] = ..., failed: _Optional[bool] = ...) -> None: ...

class CompleteTasksRequest(_message.Message):
    __slots__ = ("taskset", "consumer", "results")
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    taskset: str
    consumer: str
    results: _containers.RepeatedCompositeFieldContainer[TaskResult]
    def __init__(self, taskset: _Optional[str] = ..., consumer: _Optional[str] = ..., results: _Optional[_Iterable[_Union[TaskResult, _Mapping]]] = ...) -> None: ...

class CompleteTasksResponse(_message.Message):
    __slots__ = ("completed", "unknown")
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    completed: int
    unknown: int
    def __init__(self, completed: _Optional[int] = ..., unknown: _Optional[int] = ...) -> None: ...

class ReleaseTasksRequest(_message.Message):
    __slots__ = ("taskset", "consumer")
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    taskset: str
    consumer: str
    def __init__(self, taskset: _Optional[str] = ..., consumer: _Optional[str] = ...) -> None: ...

class ReleaseTasksResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class RenewTaskLeasesRequest(_message.Message):
    __slots__ = ("taskset", "consumer", "lease_ids", "lease_seconds")
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    taskset: str
    consumer: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_seconds: float
    def __init__(self, taskset: _Optional[str] = ..., consumer: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class RenewTaskLeasesResponse(_message.Message):
    __slots__ = ("renewed", "lost", "lease_deadline_ms")
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    renewed: _containers.RepeatedScalarFieldContainer[str]
    lost: _containers.RepeatedScalarFieldContainer[str]
    lease_deadline_ms: int
    def __init__(self, renewed: _Optional[_Iterable[str]] = ..., lost: _Optional[_Iterable[str]] = ..., lease_deadline_ms: _Optional[int] = ...) -> None: ...

class MixingSpec(_message.Message):
    __slots__ = ("strategy", "temperature", "seed")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    temperature: float
    seed: int
    def __init__(self, strategy: _Optional[str] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class MixtureMember(_message.Message):
    __slots__ = ("taskset", "weight")
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    taskset: str
    weight: float
    def __init__(self, taskset: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class MixtureSpec(_message.Message):
    __slots__ = ("name", "members", "mixing")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MIXING_FIELD_NUMBER: _ClassVar[int]
    name: str
    members: _containers.RepeatedCompositeFieldContainer[MixtureMember]
    mixing: MixingSpec
    def __init__(self, name: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MixtureMember, _Mapping]]] = ..., mixing: _Optional[_Union[MixingSpec, _Mapping]] = ...) -> None: ...

class CreateMixtureRequest(_message.Message):
    __slots__ = ("spec", "replace")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    spec: MixtureSpec
    replace: bool
    def __init__(self, spec: _Optional[_Union[MixtureSpec, _Mapping]] = ..., replace: _Optional[bool] = ...) -> None: ...

class GetMixtureRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class MixtureInfo(_message.Message):
    __slots__ = ("spec", "shares", "draws", "exhausted")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    DRAWS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    spec: MixtureSpec
    shares: _containers.RepeatedScalarFieldContainer[float]
    draws: int
    exhausted: bool
    def __init__(self, spec: _Optional[_Union[MixtureSpec, _Mapping]] = ..., shares: _Optional[_Iterable[float]] = ..., draws: _Optional[int] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class OperatorSpec(_message.Message):
    __slots__ = ("name", "params", "options")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _containers.ScalarMap[str, float]
    options: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Mapping[str, float]] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PriorityReplaySpec(_message.Message):
    __slots__ = ("enabled", "decay", "use_limit")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    USE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    decay: float
    use_limit: int
    def __init__(self, enabled: _Optional[bool] = ..., decay: _Optional[float] = ..., use_limit: _Optional[int] = ...) -> None: ...

class StreamSpec(_message.Message):
    __slots__ = ("name", "group", "max_deliveries", "claim_idle_ms", "dedupe_ttl_seconds", "operators", "priority_replay", "max_len")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    CLAIM_IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_REPLAY_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    max_deliveries: int
    claim_idle_ms: int
    dedupe_ttl_seconds: float
    operators: _containers.RepeatedCompositeFieldContainer[OperatorSpec]
    priority_replay: PriorityReplaySpec
    max_len: int
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., max_deliveries: _Optional[int] = ..., claim_idle_ms: _Optional[int] = ..., dedupe_ttl_seconds: _Optional[float] = ..., operators: _Optional[_Iterable[_Union[OperatorSpec, _Mapping]]] = ..., priority_replay: _Optional[_Union[PriorityReplaySpec, _Mapping]] = ..., max_len: _Optional[int] = ...) -> None: ...

class StreamStats(_message.Message):
    __slots__ = ("length", "pending", "lag", "dead_letters", "put", "delivered", "acked", "dropped", "consumers")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    length: int
    pending: int
    lag: int
    dead_letters: int
    put: int
    delivered: int
    acked: int
    dropped: _containers.ScalarMap[str, int]
    consumers: int
    def __init__(self, length: _Optional[int] = ..., pending: _Optional[int] = ..., lag: _Optional[int] = ..., dead_letters: _Optional[int] = ..., put: _Optional[int] = ..., delivered: _Optional[int] = ..., acked: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ..., consumers: _Optional[int] = ...) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("spec", "stats")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    spec: StreamSpec
    stats: StreamStats
    def __init__(self, spec: _Optional[_Union[StreamSpec, _Mapping]] = ..., stats: _Optional[_Union[StreamStats, _Mapping]] = ...) -> None: ...

class CreateStreamRequest(_message.Message):
    __slots__ = ("spec", "exist_ok")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    EXIST_OK_FIELD_NUMBER: _ClassVar[int]
    spec: StreamSpec
    exist_ok: bool
    def __init__(self, spec: _Optional[_Union[StreamSpec, _Mapping]] = ..., exist_ok: _Optional[bool] = ...) -> None: ...

class GetStreamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListStreamsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListStreamsResponse(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamInfo]
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamInfo, _Mapping]]] = ...) -> None: ...

class DeleteStreamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteStreamResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class PutExperiencesRequest(_message.Message):
    __slots__ = ("stream", "experiences")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    experiences: _containers.RepeatedCompositeFieldContainer[_common_pb2.Experience]
    def __init__(self, stream: _Optional[str] = ..., experiences: _Optional[_Iterable[_Union[_common_pb2.Experience, _Mapping]]] = ...) -> None: ...

class PutExperiencesResponse(_message.Message):
    __slots__ = ("accepted", "dropped")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    dropped: _containers.ScalarMap[str, int]
    def __init__(self, accepted: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReadExperiencesRequest(_message.Message):
    __slots__ = ("stream", "consumer", "batch_size", "block_ms", "min_model_version")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    stream: str
    consumer: str
    batch_size: int
    block_ms: int
    min_model_version: int
    def __init__(self, stream: _Optional[str] = ..., consumer: _Optional[str] = ..., batch_size: _Optional[int] = ..., block_ms: _Optional[int] = ..., min_model_version: _Optional[int] = ...) -> None: ...

class DeliveredExperience(_message.Message):
    __slots__ = ("entry_id", "delivery_count", "experience")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCE_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    delivery_count: int
    experience: _common_pb2.Experience
    def __init__(self, entry_id: _Optional[str] = ..., delivery_count: _Optional[int] = ..., experience: _Optional[_Union[_common_pb2.Experience, _Mapping]] = ...) -> None: ...

class ReadExperiencesResponse(_message.Message):
    __slots__ = ("items", "dropped_stale", "reclaimed", "dead_lettered", "consumer_pending")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_PENDING_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DeliveredExperience]
    dropped_stale: int
    reclaimed: int
    dead_lettered: int
    consumer_pending: int
    def __init__(self, items: _Optional[_Iterable[_Union[DeliveredExperience, _Mapping]]] = ..., dropped_stale: _Optional[int] = ..., reclaimed: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., consumer_pending: _Optional[int] = ...) -> None: ...

class AckExperiencesRequest(_message.Message):
    __slots__ = ("stream", "entry_ids")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckExperiencesResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class NackExperiencesRequest(_message.Message):
    __slots__ = ("stream", "consumer", "entry_ids", "all_pending", "keep_entry_ids")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_PENDING_FIELD_NUMBER: _ClassVar[int]
    KEEP_ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    consumer: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    all_pending: bool
    keep_entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., consumer: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ..., all_pending: _Optional[bool] = ..., keep_entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class NackExperiencesResponse(_message.Message):
    __slots__ = ("requeued", "dead_lettered")
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    requeued: int
    dead_lettered: int
    def __init__(self, requeued: _Optional[int] = ..., dead_lettered: _Optional[int] = ...) -> None: ...

class RenewExperiencesRequest(_message.Message):
    __slots__ = ("stream", "consumer", "entry_ids")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    consumer: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., consumer: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RenewExperiencesResponse(_message.Message):
    __slots__ = ("renewed",)
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    renewed: int
    def __init__(self, renewed: _Optional[int] = ...) -> None: ...

class TrimStreamRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class TrimStreamResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class SampleExperiencesRequest(_message.Message):
    __slots__ = ("stream", "limit", "min_reward", "max_reward", "model_version")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_REWARD_FIELD_NUMBER: _ClassVar[int]
    MAX_REWARD_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    stream: str
    limit: int
    min_reward: float
    max_reward: float
    model_version: int
    def __init__(self, stream: _Optional[str] = ..., limit: _Optional[int] = ..., min_reward: _Optional[float] = ..., max_reward: _Optional[float] = ..., model_version: _Optional[int] = ...) -> None: ...

class SampleExperiencesResponse(_message.Message):
    __slots__ = ("items", "scanned")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DeliveredExperience]
    scanned: int
    def __init__(self, items: _Optional[_Iterable[_Union[DeliveredExperience, _Mapping]]] = ..., scanned: _Optional[int] = ...) -> None: ...

class LoadOfflineDataRequest(_message.Message):
    __slots__ = ("stream", "path", "format", "kind", "split", "prompt_key", "response_key", "messages_key", "chosen_key", "rejected_key", "limit", "subset", "filters")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_KEY_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_KEY_FIELD_NUMBER: _ClassVar[int]
    REJECTED_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    path: str
    format: str
    kind: _common_pb2.ExperienceKind
    split: str
    prompt_key: str
    response_key: str
    messages_key: str
    chosen_key: str
    rejected_key: str
    limit: int
    subset: str
    filters: _containers.RepeatedCompositeFieldContainer[RowFilter]
    def __init__(self, stream: _Optional[str] = ..., path: _Optional[str] = ..., format: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.ExperienceKind, str]] = ..., split: _Optional[str] = ..., prompt_key: _Optional[str] = ..., response_key: _Optional[str] = ..., messages_key: _Optional[str] = ..., chosen_key: _Optional[str] = ..., rejected_key: _Optional[str] = ..., limit: _Optional[int] = ..., subset: _Optional[str] = ..., filters: _Optional[_Iterable[_Union[RowFilter, _Mapping]]] = ...) -> None: ...

class LoadOfflineDataResponse(_message.Message):
    __slots__ = ("loaded", "skipped")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    loaded: int
    skipped: int
    def __init__(self, loaded: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class ExportStreamRequest(_message.Message):
    __slots__ = ("stream", "path", "format", "overwrite")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    path: str
    format: str
    overwrite: bool
    def __init__(self, stream: _Optional[str] = ..., path: _Optional[str] = ..., format: _Optional[str] = ..., overwrite: _Optional[bool] = ...) -> None: ...

class ExportStreamResponse(_message.Message):
    __slots__ = ("exported", "path")
    EXPORTED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    exported: int
    path: str
    def __init__(self, exported: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...
