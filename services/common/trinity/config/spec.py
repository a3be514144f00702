"""A config section <-> its proto message (`TaskSetConfig` <-> `TaskSetSpec`, ...): the one conversion.

The proto messages mirror the sections key for key, so the conversion goes through the JSON form
and no field is copied by hand. A proto field left unset (zero) takes the section's default, so the
default of every knob lives in the section only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic import BaseModel, ValidationError

from trinity.config.errors import ConfigError, format_validation_error

SectionT = TypeVar("SectionT", bound=BaseModel)
MessageT = TypeVar("MessageT", bound=Message)


def to_spec(section: BaseModel, message: MessageT) -> MessageT:
    """Fill `message` (which may already hold request-only fields) with the section's values."""
    return json_format.ParseDict(section.model_dump(mode="json"), message)


def from_spec(model: type[SectionT], message: Message, field: str, *, request_only: Iterable[str] = ()) -> SectionT:
    """The validated section a message carries; `request_only` names message fields that are not the section's.

    Errors name the request field: `spec.name: 'a b' is not a valid name ...`.
    """
    try:
        values = json_format.MessageToDict(message, preserving_proto_field_name=True)
    except json_format.Error as err:  # a google.protobuf.Value holding NaN or infinity has no JSON form
        raise ConfigError(field, str(err)) from None
    for name in request_only:
        values.pop(name, None)
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise ConfigError("", format_validation_error(err, prefix=field).replace("\n", "; ")) from None
