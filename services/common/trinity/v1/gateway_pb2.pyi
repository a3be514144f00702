from trinity.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_PENDING: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_SUCCEEDED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_CANCELLED: _ClassVar[RunState]
    RUN_STATE_PAUSED: _ClassVar[RunState]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_STATE: _ClassVar[EventKind]
    EVENT_KIND_TRAIN: _ClassVar[EventKind]
    EVENT_KIND_EXPLORE: _ClassVar[EventKind]
    EVENT_KIND_EVAL: _ClassVar[EventKind]
    EVENT_KIND_WEIGHTS: _ClassVar[EventKind]
    EVENT_KIND_LOG: _ClassVar[EventKind]
    EVENT_KIND_STEER: _ClassVar[EventKind]
    EVENT_KIND_ERROR: _ClassVar[EventKind]
    EVENT_KIND_FINISHED: _ClassVar[EventKind]
    EVENT_KIND_LEAVING: _ClassVar[EventKind]
    EVENT_KIND_WARNING: _ClassVar[EventKind]
    EVENT_KIND_SPAN: _ClassVar[EventKind]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_MODEL_CONVERT: _ClassVar[Phase]
    PHASE_ENGINE_START: _ClassVar[Phase]
    PHASE_MODEL_LOAD: _ClassVar[Phase]
    PHASE_SYNC_FORM: _ClassVar[Phase]
    PHASE_WEIGHT_WAIT: _ClassVar[Phase]
    PHASE_WEIGHT_RECEIVE: _ClassVar[Phase]
    PHASE_WEIGHT_LOAD: _ClassVar[Phase]
    PHASE_LEASE: _ClassVar[Phase]
    PHASE_ROLLOUT: _ClassVar[Phase]
    PHASE_REWARD: _ClassVar[Phase]
    PHASE_PUT: _ClassVar[Phase]
    PHASE_EVALUATE: _ClassVar[Phase]
    PHASE_READ_BATCH: _ClassVar[Phase]
    PHASE_PREPARE: _ClassVar[Phase]
    PHASE_FORWARD_BACKWARD: _ClassVar[Phase]
    PHASE_OPTIMIZER: _ClassVar[Phase]
    PHASE_CHECKPOINT: _ClassVar[Phase]
    PHASE_PUBLISH_WEIGHTS: _ClassVar[Phase]
    PHASE_EXPORT: _ClassVar[Phase]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_PENDING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_CANCELLED: RunState
RUN_STATE_PAUSED: RunState
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_STATE: EventKind
EVENT_KIND_TRAIN: EventKind
EVENT_KIND_EXPLORE: EventKind
EVENT_KIND_EVAL: EventKind
EVENT_KIND_WEIGHTS: EventKind
EVENT_KIND_LOG: EventKind
EVENT_KIND_STEER: EventKind
EVENT_KIND_ERROR: EventKind
EVENT_KIND_FINISHED: EventKind
EVENT_KIND_LEAVING: EventKind
EVENT_KIND_WARNING: EventKind
EVENT_KIND_SPAN: EventKind
PHASE_UNSPECIFIED: Phase
PHASE_MODEL_CONVERT: Phase
PHASE_ENGINE_START: Phase
PHASE_MODEL_LOAD: Phase
PHASE_SYNC_FORM: Phase
PHASE_WEIGHT_WAIT: Phase
PHASE_WEIGHT_RECEIVE: Phase
PHASE_WEIGHT_LOAD: Phase
PHASE_LEASE: Phase
PHASE_ROLLOUT: Phase
PHASE_REWARD: Phase
PHASE_PUT: Phase
PHASE_EVALUATE: Phase
PHASE_READ_BATCH: Phase
PHASE_PREPARE: Phase
PHASE_FORWARD_BACKWARD: Phase
PHASE_OPTIMIZER: Phase
PHASE_CHECKPOINT: Phase
PHASE_PUBLISH_WEIGHTS: Phase
PHASE_EXPORT: Phase

class Run(_message.Message):
    __slots__ = ("id", "name", "state", "config_json", "created_unix_ms", "updated_unix_ms", "error", "train_step", "explore_step", "model_version", "stage", "latest_metrics", "assignments", "finished", "final_model_path", "lost_unix_ms", "explorers", "leaving", "tenant", "priority", "queued_unix_ms", "resuming")
    class LatestMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AssignmentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LostUnixMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEP_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LATEST_METRICS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINAL_MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    LOST_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPLORERS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RESUMING_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: RunState
    config_json: str
    created_unix_ms: int
    updated_unix_ms: int
    error: str
    train_step: int
    explore_step: int
    model_version: int
    stage: int
    latest_metrics: _containers.ScalarMap[str, float]
    assignments: _containers.ScalarMap[str, str]
    finished: _containers.RepeatedScalarFieldContainer[str]
    final_model_path: str
    lost_unix_ms: _containers.ScalarMap[str, int]
    explorers: int
    leaving: _containers.RepeatedScalarFieldContainer[str]
    tenant: str
    priority: int
    queued_unix_ms: int
    resuming: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., config_json: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., error: _Optional[str] = ..., train_step: _Optional[int] = ..., explore_step: _Optional[int] = ..., model_version: _Optional[int] = ..., stage: _Optional[int] = ..., latest_metrics: _Optional[_Mapping[str, float]] = ..., assignments: _Optional[_Mapping[str, str]] = ..., finished: _Optional[_Iterable[str]] = ..., final_model_path: _Optional[str] = ..., lost_unix_ms: _Optional[_Mapping[str, int]] = ..., explorers: _Optional[int] = ..., leaving: _Optional[_Iterable[str]] = ..., tenant: _Optional[str] = ..., priority: _Optional[int] = ..., queued_unix_ms: _Optional[int] = ..., resuming: _Optional[bool] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("config_yaml", "run_id", "request_id", "priority")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    run_id: str
    request_id: str
    priority: int
    def __init__(self, config_yaml: _Optional[str] = ..., run_id: _Optional[str] = ..., request_id: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ScaleRunRequest(_message.Message):
    __slots__ = ("run_id", "explorers")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLORERS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    explorers: int
    def __init__(self, run_id: _Optional[str] = ..., explorers: _Optional[int] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("phase", "source", "stage", "step", "model_version", "start_unix_ms", "end_unix_ms", "detail")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    source: str
    stage: int
    step: int
    model_version: int
    start_unix_ms: int
    end_unix_ms: int
    detail: str
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., source: _Optional[str] = ..., stage: _Optional[int] = ..., step: _Optional[int] = ..., model_version: _Optional[int] = ..., start_unix_ms: _Optional[int] = ..., end_unix_ms: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("run_id", "seq", "kind", "source", "step", "model_version", "metrics", "message", "unix_ms", "state", "stage", "final_model_path", "event_id", "spans")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FINAL_MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: str
    kind: EventKind
    source: str
    step: int
    model_version: int
    metrics: _containers.ScalarMap[str, float]
    message: str
    unix_ms: int
    state: RunState
    stage: int
    final_model_path: str
    event_id: str
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[str] = ..., kind: _Optional[_Union[EventKind, str]] = ..., source: _Optional[str] = ..., step: _Optional[int] = ..., model_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., message: _Optional[str] = ..., unix_ms: _Optional[int] = ..., state: _Optional[_Union[RunState, str]] = ..., stage: _Optional[int] = ..., final_model_path: _Optional[str] = ..., event_id: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run_id", "after_seq")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: str
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[str] = ...) -> None: ...

class ReportEventRequest(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: RunEvent
    def __init__(self, event: _Optional[_Union[RunEvent, _Mapping]] = ...) -> None: ...

class ReportEventResponse(_message.Message):
    __slots__ = ("seq", "run_active")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RUN_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    seq: str
    run_active: bool
    def __init__(self, seq: _Optional[str] = ..., run_active: _Optional[bool] = ...) -> None: ...

class GetRunSpansRequest(_message.Message):
    __slots__ = ("run_id", "since_step")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_STEP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    since_step: int
    def __init__(self, run_id: _Optional[str] = ..., since_step: _Optional[int] = ...) -> None: ...

class GetRunSpansResponse(_message.Message):
    __slots__ = ("spans",)
    SPANS_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class SteerRunRequest(_message.Message):
    __slots__ = ("run_id", "steering")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEERING_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    steering: _common_pb2.Steering
    def __init__(self, run_id: _Optional[str] = ..., steering: _Optional[_Union[_common_pb2.Steering, _Mapping]] = ...) -> None: ...

class SteerRunResponse(_message.Message):
    __slots__ = ("applied", "changes")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    applied: _containers.RepeatedScalarFieldContainer[str]
    changes: _containers.RepeatedCompositeFieldContainer[_common_pb2.SteerChange]
    def __init__(self, applied: _Optional[_Iterable[str]] = ..., changes: _Optional[_Iterable[_Union[_common_pb2.SteerChange, _Mapping]]] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("instance_id", "service", "address", "has_gpu", "alive", "last_heartbeat_unix_ms", "run_id", "started_unix_ms", "stage")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HAS_GPU_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    service: str
    address: str
    has_gpu: bool
    alive: bool
    last_heartbeat_unix_ms: int
    run_id: str
    started_unix_ms: int
    stage: int
    def __init__(self, instance_id: _Optional[str] = ..., service: _Optional[str] = ..., address: _Optional[str] = ..., has_gpu: _Optional[bool] = ..., alive: _Optional[bool] = ..., last_heartbeat_unix_ms: _Optional[int] = ..., run_id: _Optional[str] = ..., started_unix_ms: _Optional[int] = ..., stage: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: Instance
    def __init__(self, instance: _Optional[_Union[Instance, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval_seconds",)
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: float
    def __init__(self, heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("instance_id", "run_id", "stage")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    run_id: str
    stage: int
    def __init__(self, instance_id: _Optional[str] = ..., run_id: _Optional[str] = ..., stage: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ...) -> None: ...

class SyncMember(_message.Message):
    __slots__ = ("instance_id", "rank", "has_gpu", "host_id", "gpu_uuids", "ranks")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HAS_GPU_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    rank: int
    has_gpu: bool
    host_id: str
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    ranks: int
    def __init__(self, instance_id: _Optional[str] = ..., rank: _Optional[int] = ..., has_gpu: _Optional[bool] = ..., host_id: _Optional[str] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., ranks: _Optional[int] = ...) -> None: ...

class SyncGroup(_message.Message):
    __slots__ = ("run_id", "generation", "backend", "host", "port", "world_size", "members", "ready", "announced_version", "checkpoint_dir", "timeout_seconds", "bucket_mb", "rank", "secret", "members_expected")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ANNOUNCED_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_MB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    generation: int
    backend: str
    host: str
    port: int
    world_size: int
    members: _containers.RepeatedCompositeFieldContainer[SyncMember]
    ready: bool
    announced_version: int
    checkpoint_dir: str
    timeout_seconds: float
    bucket_mb: float
    rank: int
    secret: bytes
    members_expected: int
    def __init__(self, run_id: _Optional[str] = ..., generation: _Optional[int] = ..., backend: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., world_size: _Optional[int] = ..., members: _Optional[_Iterable[_Union[SyncMember, _Mapping]]] = ..., ready: _Optional[bool] = ..., announced_version: _Optional[int] = ..., checkpoint_dir: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., bucket_mb: _Optional[float] = ..., rank: _Optional[int] = ..., secret: _Optional[bytes] = ..., members_expected: _Optional[int] = ...) -> None: ...

class OpenSyncGroupRequest(_message.Message):
    __slots__ = ("run_id", "instance_id", "host", "port", "has_gpu", "backend", "explorer_workers", "checkpoint_dir", "timeout_seconds", "bucket_mb", "host_id", "gpu_uuids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    HAS_GPU_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXPLORER_WORKERS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_MB_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    instance_id: str
    host: str
    port: int
    has_gpu: bool
    backend: str
    explorer_workers: int
    checkpoint_dir: str
    timeout_seconds: float
    bucket_mb: float
    host_id: str
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., has_gpu: _Optional[bool] = ..., backend: _Optional[str] = ..., explorer_workers: _Optional[int] = ..., checkpoint_dir: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., bucket_mb: _Optional[float] = ..., host_id: _Optional[str] = ..., gpu_uuids: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinSyncGroupRequest(_message.Message):
    __slots__ = ("run_id", "instance_id", "has_gpu", "host_id", "gpu_uuids", "ranks")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_GPU_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    instance_id: str
    has_gpu: bool
    host_id: str
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    ranks: int
    def __init__(self, run_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., has_gpu: _Optional[bool] = ..., host_id: _Optional[str] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., ranks: _Optional[int] = ...) -> None: ...

class GetSyncGroupRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class AnnounceWeightsRequest(_message.Message):
    __slots__ = ("run_id", "generation", "version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    generation: int
    version: int
    def __init__(self, run_id: _Optional[str] = ..., generation: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class ReportSyncFailureRequest(_message.Message):
    __slots__ = ("run_id", "generation", "instance_id", "error")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    generation: int
    instance_id: str
    error: str
    def __init__(self, run_id: _Optional[str] = ..., generation: _Optional[int] = ..., instance_id: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class GetRankSecretRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RankSecret(_message.Message):
    __slots__ = ("secret",)
    SECRET_FIELD_NUMBER: _ClassVar[int]
    secret: bytes
    def __init__(self, secret: _Optional[bytes] = ...) -> None: ...
