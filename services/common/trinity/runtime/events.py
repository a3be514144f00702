"""Run event kinds (`trinity.v1.EventKind`) by their short names: the `train` of metric keys (`train/loss`), of log
lines and of the console's JSON, which read as they did when the kind travelled as text; and recorded events,
decoded alike by every reader, those recorded before EventKind included."""

from __future__ import annotations

from typing import cast

from google.protobuf import unknown_fields

from trinity.v1 import gateway_pb2

PREFIX = "EVENT_KIND_"


def kind_name(kind: gateway_pb2.EventKind) -> str:
    """`EVENT_KIND_TRAIN` -> `train`; `unspecified` for 0 and for a value this build does not know (a newer peer's)."""
    name = gateway_pb2.EventKind.Name(kind) if kind in gateway_pb2.EventKind.values() else "EVENT_KIND_UNSPECIFIED"
    return name.removeprefix(PREFIX).lower()


def kind_named(name: str) -> gateway_pb2.EventKind:
    """`train` -> `EVENT_KIND_TRAIN`, for kinds still written as text (events of runs recorded before EventKind);
    EVENT_KIND_UNSPECIFIED for a name no kind has."""
    try:
        return cast("gateway_pb2.EventKind", gateway_pb2.EventKind.Value(PREFIX + name.upper()))
    except ValueError:
        return gateway_pb2.EVENT_KIND_UNSPECIFIED


def decode_event(raw: bytes) -> gateway_pb2.RunEvent:
    """A recorded RunEvent. One recorded before EventKind has its kind as text in field 3 (now reserved): it reads
    as the EventKind of that name, so that an older run's history reads as a new one's."""
    event = gateway_pb2.RunEvent.FromString(raw)
    if not event.kind:
        unknown = unknown_fields.UnknownFieldSet(event)
        fields = [unknown[i] for i in range(len(unknown))]
        text = [f.data for f in fields if f.field_number == 3 and f.wire_type == 2]  # wire type 2: the old string
        event.kind = kind_named(text[0].decode(errors="replace")) if text else gateway_pb2.EVENT_KIND_UNSPECIFIED
        event.DiscardUnknownFields()
    return event
