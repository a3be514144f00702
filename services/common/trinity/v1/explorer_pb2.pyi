from trinity.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_TRAINING_FINISHED: _ClassVar[StopReason]
    STOP_REASON_INPUT_EXHAUSTED: _ClassVar[StopReason]
    STOP_REASON_CANCELLED: _ClassVar[StopReason]
    STOP_REASON_FAILED: _ClassVar[StopReason]
    STOP_REASON_SHUTDOWN: _ClassVar[StopReason]
    STOP_REASON_SCALED_DOWN: _ClassVar[StopReason]
    STOP_REASON_PAUSED: _ClassVar[StopReason]
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_TRAINING_FINISHED: StopReason
STOP_REASON_INPUT_EXHAUSTED: StopReason
STOP_REASON_CANCELLED: StopReason
STOP_REASON_FAILED: StopReason
STOP_REASON_SHUTDOWN: StopReason
STOP_REASON_SCALED_DOWN: StopReason
STOP_REASON_PAUSED: StopReason

class StartRunRequest(_message.Message):
    __slots__ = ("run_id", "config_json", "buffer_address", "gateway_address", "stage", "resume_model_version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RESUME_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_json: str
    buffer_address: str
    gateway_address: str
    stage: int
    resume_model_version: int
    def __init__(self, run_id: _Optional[str] = ..., config_json: _Optional[str] = ..., buffer_address: _Optional[str] = ..., gateway_address: _Optional[str] = ..., stage: _Optional[int] = ..., resume_model_version: _Optional[int] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("run_id", "detail", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    detail: str
    reason: StopReason
    def __init__(self, run_id: _Optional[str] = ..., detail: _Optional[str] = ..., reason: _Optional[_Union[StopReason, str]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "n", "temperature", "top_p", "top_k", "max_tokens", "stop")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class GeneratedSample(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs", "finish_reason")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("prompt_token_ids", "samples", "model_version")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    samples: _containers.RepeatedCompositeFieldContainer[GeneratedSample]
    model_version: int
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., samples: _Optional[_Iterable[_Union[GeneratedSample, _Mapping]]] = ..., model_version: _Optional[int] = ...) -> None: ...
