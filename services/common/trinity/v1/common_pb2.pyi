from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExperienceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPERIENCE_KIND_UNSPECIFIED: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_ROLLOUT: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_SFT: _ClassVar[ExperienceKind]
    EXPERIENCE_KIND_PREFERENCE: _ClassVar[ExperienceKind]
EXPERIENCE_KIND_UNSPECIFIED: ExperienceKind
EXPERIENCE_KIND_ROLLOUT: ExperienceKind
EXPERIENCE_KIND_SFT: ExperienceKind
EXPERIENCE_KIND_PREFERENCE: ExperienceKind

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "taskset", "index", "epoch", "prompt", "answer", "messages", "workflow", "reward_fn", "payload", "pass_rate", "lease_deadline_ms", "lease_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    REWARD_FN_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PASS_RATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    taskset: str
    index: int
    epoch: int
    prompt: str
    answer: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    workflow: str
    reward_fn: str
    payload: _struct_pb2.Struct
    pass_rate: float
    lease_deadline_ms: int
    lease_id: str
    def __init__(self, id: _Optional[str] = ..., taskset: _Optional[str] = ..., index: _Optional[int] = ..., epoch: _Optional[int] = ..., prompt: _Optional[str] = ..., answer: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., workflow: _Optional[str] = ..., reward_fn: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., pass_rate: _Optional[float] = ..., lease_deadline_ms: _Optional[int] = ..., lease_id: _Optional[str] = ...) -> None: ...

class Preference(_message.Message):
    __slots__ = ("rejected_token_ids", "rejected_text")
    REJECTED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TEXT_FIELD_NUMBER: _ClassVar[int]
    rejected_token_ids: _containers.RepeatedScalarFieldContainer[int]
    rejected_text: str
    def __init__(self, rejected_token_ids: _Optional[_Iterable[int]] = ..., rejected_text: _Optional[str] = ...) -> None: ...

class Experience(_message.Message):
    __slots__ = ("id", "kind", "run_id", "taskset", "task_id", "group_id", "model_version", "prompt_token_ids", "response_token_ids", "logprobs", "action_mask", "token_rewards", "teacher_logprobs", "reward", "reward_components", "metrics", "info", "prompt_text", "response_text", "messages", "preference", "episode_id", "step_index", "state_key", "finish_reason", "failed", "error", "created_unix_ms")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASKSET_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ACTION_MASK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_KEY_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: ExperienceKind
    run_id: str
    taskset: str
    task_id: str
    group_id: str
    model_version: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    action_mask: _containers.RepeatedScalarFieldContainer[bool]
    token_rewards: _containers.RepeatedScalarFieldContainer[float]
    teacher_logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    reward_components: _containers.ScalarMap[str, float]
    metrics: _containers.ScalarMap[str, float]
    info: _containers.ScalarMap[str, str]
    prompt_text: str
    response_text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    preference: Preference
    episode_id: str
    step_index: int
    state_key: str
    finish_reason: str
    failed: bool
    error: str
    created_unix_ms: int
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[ExperienceKind, str]] = ..., run_id: _Optional[str] = ..., taskset: _Optional[str] = ..., task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., model_version: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., action_mask: _Optional[_Iterable[bool]] = ..., token_rewards: _Optional[_Iterable[float]] = ..., teacher_logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., info: _Optional[_Mapping[str, str]] = ..., prompt_text: _Optional[str] = ..., response_text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., preference: _Optional[_Union[Preference, _Mapping]] = ..., episode_id: _Optional[str] = ..., step_index: _Optional[int] = ..., state_key: _Optional[str] = ..., finish_reason: _Optional[str] = ..., failed: _Optional[bool] = ..., error: _Optional[str] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...

class ServiceStatus(_message.Message):
    __slots__ = ("service", "instance_id", "version", "run_id", "state", "model_version", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    service: str
    instance_id: str
    version: str
    run_id: str
    state: str
    model_version: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, service: _Optional[str] = ..., instance_id: _Optional[str] = ..., version: _Optional[str] = ..., run_id: _Optional[str] = ..., state: _Optional[str] = ..., model_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Steering(_message.Message):
    __slots__ = ("pause_exploration", "temperature", "learning_rate")
    PAUSE_EXPLORATION_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    pause_exploration: bool
    temperature: float
    learning_rate: float
    def __init__(self, pause_exploration: _Optional[bool] = ..., temperature: _Optional[float] = ..., learning_rate: _Optional[float] = ...) -> None: ...

class SteerChange(_message.Message):
    __slots__ = ("knob", "old_value", "new_value", "source")
    KNOB_FIELD_NUMBER: _ClassVar[int]
    OLD_VALUE_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    knob: str
    old_value: float
    new_value: float
    source: str
    def __init__(self, knob: _Optional[str] = ..., old_value: _Optional[float] = ..., new_value: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class SteerRequest(_message.Message):
    __slots__ = ("run_id", "steering")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEERING_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    steering: Steering
    def __init__(self, run_id: _Optional[str] = ..., steering: _Optional[_Union[Steering, _Mapping]] = ...) -> None: ...

class SteerResponse(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[SteerChange]
    def __init__(self, changes: _Optional[_Iterable[_Union[SteerChange, _Mapping]]] = ...) -> None: ...
