"""Protobuf wire-level passthrough for the experience data path.

Experiences are stored in Redis as the serialized `Experience` bytes. Parsing them only to serialize
them again costs as much as the Redis work itself, so the two hot RPCs skip that round:

- PutExperiences: the request is parsed (validation and operators need the fields), and each experience's
  bytes are also sliced out of the request as the client sent them; those bytes go to Redis.
- ReadExperiences: the reply's wire bytes are assembled around the stored bytes, never parsed.

(BufferClient.put does the same on its side: it assembles the request from each experience's bytes.)

Wire format (https://protobuf.dev/programming-guides/encoding/): a field is a varint tag
`(field_number << 3) | wire_type`, then a varint (type 0), 8 bytes (type 1), 4 bytes (type 5), or a
varint length and that many bytes (type 2: strings, bytes, sub-messages, packed repeated fields).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import grpc

from trinity.v1 import buffer_pb2, buffer_pb2_grpc

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5

# Field keys, (field_number << 3) | wire_type, as the single bytes they encode to.
_ITEMS = b"\x0a"  # ReadExperiencesResponse.items (1, length-delimited)
# .dropped_stale (2), .reclaimed (3), .dead_lettered (4), .consumer_pending (5): varints
_COUNTERS = (b"\x10", b"\x18", b"\x20", b"\x28")
_ENTRY_ID, _DELIVERY_COUNT, _EXPERIENCE = b"\x0a", b"\x10", b"\x1a"  # DeliveredExperience 1, 2, 3
_PUT_EXPERIENCES = 2 << 3 | _LENGTH  # PutExperiencesRequest.experiences


def varint(value: int) -> bytes:
    """Base-128 varint; negative int32/int64 take the 10-byte two's complement form, as protobuf does."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


class DeliveredPayload(Protocol):
    entry_id: str
    deliveries: int
    payload: bytes


def encode_read_response(
    entries: Sequence[DeliveredPayload],
    *,
    dropped_stale: int = 0,
    reclaimed: int = 0,
    dead_lettered: int = 0,
    consumer_pending: int = 0,
) -> bytes:
    """The serialized `ReadExperiencesResponse` whose items carry each entry's stored bytes unchanged.

    Parses to the same message as building the response field by field; zero counters are left out,
    as proto3 serialization does.
    """
    parts: list[bytes] = []
    append = parts.append
    for entry in entries:
        entry_id = entry.entry_id.encode()
        payload = entry.payload
        size = len(payload)
        delivery = _DELIVERY_COUNT + _varint(entry.deliveries) if entry.deliveries else b""
        head = b"%b%b%b%b%b%b" % (_ENTRY_ID, _varint(len(entry_id)), entry_id, delivery, _EXPERIENCE, _varint(size))
        append(_ITEMS + _varint(len(head) + size) + head)
        append(payload)
    for key, value in zip(_COUNTERS, (dropped_stale, reclaimed, dead_lettered, consumer_pending), strict=True):
        if value:
            append(key + varint(value))
    return b"".join(parts)


_SMALL_VARINTS = [varint(n) for n in range(1 << 14)]  # every one- and two-byte varint


def _varint(value: int) -> bytes:
    return _SMALL_VARINTS[value] if 0 <= value < 16384 else varint(value)


def field_slices(data: bytes, tag: int) -> list[memoryview] | None:
    """The payloads of every length-delimited top-level field with `tag`, in order (views, not copies).

    None when the message holds something this scanner does not walk (deprecated groups), so that the
    caller falls back to serializing the parsed message.
    """
    found: list[memoryview] = []
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _read_varint(data, pos)
        wire_type = key & 7
        if wire_type == _LENGTH:
            size, pos = _read_varint(data, pos)
            if key == tag:
                found.append(view[pos : pos + size])
            pos += size
        elif wire_type == _VARINT:
            _, pos = _read_varint(data, pos)
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        else:
            return None
    return found


@dataclass
class PutExperiencesWire:
    """A parsed PutExperiencesRequest with each experience's bytes as sent (`payloads[i]` is `experiences[i]`)."""

    DESCRIPTOR: ClassVar[Any] = buffer_pb2.PutExperiencesRequest.DESCRIPTOR  # the type it parses, for errors

    request: buffer_pb2.PutExperiencesRequest
    payloads: list[memoryview] | None

    @classmethod
    def from_bytes(cls, data: bytes) -> PutExperiencesWire:
        request = buffer_pb2.PutExperiencesRequest.FromString(data)  # raises on malformed input, like grpc would
        payloads = field_slices(data, _PUT_EXPERIENCES)
        if payloads is not None and len(payloads) != len(request.experiences):
            payloads = None
        return cls(request, payloads)


def _identity(data: bytes) -> bytes:
    return data


class _CaptureHandlers:
    """Stands in for a grpc.Server to collect the generated code's method handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, dict(handlers)


def add_buffer_servicer_to_server(servicer: buffer_pb2_grpc.BufferServiceServicer, server: grpc.Server) -> None:
    """The generated registration, except PutExperiences takes raw bytes and ReadExperiences sends raw bytes.

    The servicer's PutExperiences then receives a `PutExperiencesWire` and its ReadExperiences returns
    the encoded reply (`encode_read_response`). Clients see the unchanged contract.
    """
    capture = _CaptureHandlers()
    buffer_pb2_grpc.add_BufferServiceServicer_to_server(servicer, capture)
    overrides: dict[str, tuple[Callable[..., Any], Callable[[bytes], Any], Callable[[Any], bytes]]] = {
        "PutExperiences": (
            servicer.PutExperiences,
            PutExperiencesWire.from_bytes,
            buffer_pb2.PutExperiencesResponse.SerializeToString,
        ),
        "ReadExperiences": (servicer.ReadExperiences, buffer_pb2.ReadExperiencesRequest.FromString, _identity),
    }
    for name, (behavior, deserialize, serialize) in overrides.items():
        capture.handlers[name] = grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=deserialize, response_serializer=serialize
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, capture.handlers),))
    server.add_registered_method_handlers(capture.service, capture.handlers)
