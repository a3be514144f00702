"""A small structure-aware gRPC fuzzer: methods found by server reflection, requests built from their descriptors.

Each request is either random (every field set or not at random, to a value of its type drawn from edge cases:
empty, huge, negative, NaN, paths out of the data roots...) or a mutation of a plausible request (fields named
like the fuzz stack's stream, task set and run, with one to three of them replaced by an edge case), so that the
checks behind the first lookup are reached too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

SKIPPED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")
HUGE_TEXT = 256 * 1024  # characters of a "huge" string: far past every name limit, well under the message limit
HUGE_COUNT = 10_001  # entries of a "huge" repeated field: one past the per-request limit
MAX_REQUEST_BYTES = 16 << 20

EDGE_TEXT = ("", "a", " ", "\x00", "../../../../etc/passwd", "/etc/passwd", "~/.ssh/id_rsa", "%s%n{}*&", "ü🙂\u202e")
EDGE_INT32 = (0, 1, -1, 2, 2**31 - 1, -(2**31))
EDGE_INT64 = (0, 1, -1, 2**63 - 1, -(2**63), 2**31)
EDGE_UINT = (0, 1, 2**32 - 1)
EDGE_FLOAT = (0.0, -0.0, 1.0, -1.0, 0.5, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324)


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    descriptor: MethodDescriptor
    request: type[Message]
    response: type[Message]

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def streaming(self) -> bool:
        return bool(self.descriptor.server_streaming)


def discover(channel: grpc.Channel) -> list[Method]:
    """Every RPC method the server lists through reflection (health and reflection themselves left out)."""
    database = ProtoReflectionDescriptorDatabase(channel)
    pool = descriptor_pool.DescriptorPool(database)
    methods = []
    for service_name in database.get_services():
        if service_name in SKIPPED_SERVICES:
            continue
        service = pool.FindServiceByName(service_name)
        for method in service.methods:
            methods.append(
                Method(
                    service_name,
                    method.name,
                    method,
                    message_factory.GetMessageClass(method.input_type),
                    message_factory.GetMessageClass(method.output_type),
                )
            )
    return methods


class RequestFactory:
    """Random and mutated requests of any message type, from one seeded generator."""

    def __init__(self, rng: random.Random, plausible: Mapping[str, Any]) -> None:
        self.rng = rng
        self.plausible = plausible

    def requests(self, method: Method, count: int) -> Iterator[Message]:
        for i in range(count):
            build = self.random if i % 2 == 0 else self.mutated
            for _ in range(20):  # a value protobuf refuses (or an oversized whole) is drawn again
                try:
                    request = build(method.request.DESCRIPTOR, method.request)
                except (ValueError, TypeError, OverflowError):
                    continue
                if request.ByteSize() <= MAX_REQUEST_BYTES:
                    yield request
                    break

    # ---- whole messages --------------------------------------------------------------------------------------

    def random(self, descriptor: Descriptor, cls: type[Message] | None = None, depth: int = 0) -> Message:
        message = (cls or message_factory.GetMessageClass(descriptor))()
        for field in descriptor.fields:
            if self.rng.random() < 0.5:
                self._fill(message, field, depth)
        return message

    def plausible_message(self, descriptor: Descriptor, cls: type[Message] | None = None, depth: int = 0) -> Message:
        """Fields named like the stack's real things get their real values; nested messages likewise."""
        message = (cls or message_factory.GetMessageClass(descriptor))()
        for field in descriptor.fields:
            if field.name in self.plausible and not _is_map(field):
                value = self.plausible[field.name]
                try:
                    if _is_repeated(field):
                        getattr(message, field.name).extend(value if isinstance(value, list) else [value])
                    else:
                        setattr(message, field.name, value)
                except (TypeError, ValueError):
                    continue
            elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_repeated(field) and depth < 2:
                getattr(message, field.name).CopyFrom(self.plausible_message(field.message_type, depth=depth + 1))
        return message

    def mutated(self, descriptor: Descriptor, cls: type[Message] | None = None) -> Message:
        message = self.plausible_message(descriptor, cls)
        fields = list(descriptor.fields)
        if not fields:
            return message
        for field in self.rng.sample(fields, k=min(len(fields), self.rng.randint(1, 3))):
            message.ClearField(field.name)
            self._fill(message, field, depth=0)
        return message

    # ---- fields ----------------------------------------------------------------------------------------------

    def _fill(self, message: Message, field: FieldDescriptor, depth: int) -> None:
        target = getattr(message, field.name)
        if _is_map(field):
            entry = field.message_type.fields_by_name
            key_field, value_field = entry["key"], entry["value"]
            for _ in range(self._count(depth)):
                key = self._scalar(key_field, huge=False)
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    target[key].CopyFrom(self.random(value_field.message_type, depth=depth + 1))
                else:
                    target[key] = self._scalar(value_field, huge=False)
        elif _is_repeated(field):
            count = self._count(depth)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                if depth >= 3:
                    return
                nested = 0 if count > 100 else depth + 1  # a huge list of messages holds small ones
                for _ in range(count):
                    item = target.add()
                    if nested:
                        item.CopyFrom(self.random(field.message_type, depth=nested))
            else:
                target.extend(self._scalar(field, huge=False) for _ in range(count))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 3:
                target.CopyFrom(self.random(field.message_type, depth=depth + 1))
        else:
            setattr(message, field.name, self._scalar(field, huge=depth == 0))

    def _count(self, depth: int) -> int:
        """Entries of a repeated field: huge ones at the top of a request only (keeps each request small enough)."""
        return self.rng.choice((0, 1, 2, 5, 50, HUGE_COUNT) if depth == 0 else (0, 1, 2, 5))

    def _scalar(self, field: FieldDescriptor, huge: bool) -> Any:
        kind, rng = field.type, self.rng
        if kind in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            text = self._text(huge)
            return text.encode("utf-8", "surrogatepass") if kind == FieldDescriptor.TYPE_BYTES else text
        if kind == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            value = rng.choice(EDGE_FLOAT) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6)
            if kind == FieldDescriptor.TYPE_FLOAT and math.isfinite(value):
                value = max(-3e38, min(3e38, value))  # a finite double past float's range is refused, not fuzzed
            return value
        if kind == FieldDescriptor.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return rng.choice(known) if rng.random() < 0.7 else rng.choice(EDGE_INT32)
        if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
            return rng.choice(EDGE_INT64) if rng.random() < 0.7 else rng.randint(-(10**6), 10**6)
        if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
            return rng.choice(EDGE_UINT)
        if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            return rng.choice((0, 1, 2**64 - 1))
        return rng.choice(EDGE_INT32) if rng.random() < 0.7 else rng.randint(-(10**6), 10**6)

    def _text(self, huge: bool) -> str:
        roll = self.rng.random()
        if roll < 0.4:
            return self.rng.choice(EDGE_TEXT)
        if roll < 0.55:
            return self.rng.choice([str(v) for v in self.plausible.values() if isinstance(v, str)])
        if roll < 0.7 and huge:
            return self.rng.choice("ab/.-_ü") * HUGE_TEXT
        length = self.rng.randint(1, 40)
        return "".join(chr(self.rng.randint(32, 0x2FF)) for _ in range(length))


def corrupt_bytes(rng: random.Random, valid: bytes) -> bytes:
    """Bytes that protobuf is unlikely to parse: a field whose length runs past the end, a truncated varint, or
    `valid` with a few bits flipped (which may still parse: the call must then be answered as any request is)."""
    choice = rng.randrange(3)
    if choice == 0:
        return bytes([rng.randint(1, 15) << 3 | 2, 0x7F]) + rng.randbytes(rng.randint(0, 20))
    if choice == 1:
        return bytes([rng.randint(1, 15) << 3]) + b"\xff" * rng.randint(1, 11)
    flipped = bytearray(valid or b"\x08\x01")
    for _ in range(rng.randint(1, 4)):
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    return bytes(flipped)


def call(channel: grpc.Channel, method: Method, request: Message | bytes, timeout: float) -> grpc.StatusCode:
    """The status a call ends with; a stream is read to its end (or its deadline). `request` as bytes goes out as
    they are (a corrupt request)."""
    return call_detailed(channel, method, request, timeout)[0]


def call_detailed(
    channel: grpc.Channel, method: Method, request: Message | bytes, timeout: float
) -> tuple[grpc.StatusCode, str]:
    """`call`'s status and its details."""
    try:
        if method.streaming:
            stub = channel.unary_stream(
                method.path, request_serializer=_serialize, response_deserializer=method.response.FromString
            )
            for _ in stub(request, timeout=timeout):
                pass
        else:
            unary = channel.unary_unary(
                method.path, request_serializer=_serialize, response_deserializer=method.response.FromString
            )
            unary(request, timeout=timeout)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def _serialize(message: Message | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _is_map(field: FieldDescriptor) -> bool:
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    return _is_repeated(field) and is_message and field.message_type.GetOptions().map_entry
