"""docs/config.md, generated from the schema: every key of a run config with its type, default and meaning.

    python -m trinity.config.reference > docs/config.md

`tests/config/test_reference.py` fails when the page and the schema disagree.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trinity.config.run import RunConfig

COMMAND = "python -m trinity.config.reference > docs/config.md"


@dataclass(frozen=True)
class Section:
    """One table of the page: a model class at a dotted path (`buffer.taskset`), `variant` for union members."""

    path: str
    model: type[BaseModel]
    variant: str = ""


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config classes an annotation holds: `X`, `X | None`, `tuple[X, ...]`, `A | B` (a union of shapes)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found += [m for m in models_in(arg) if m not in found]
    return found


def sections(model: type[BaseModel] = RunConfig, path: str = "") -> Iterator[Section]:
    """Every section, depth first; a class reached again (eval_tasksets[] is like taskset) is listed once."""
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], path: str, variant: str) -> Iterator[Section]:
        seen.add(model)
        yield Section(path, model, variant)
        for name, field in model.model_fields.items():
            children = [m for m in models_in(field.annotation) if m not in seen]
            for child in children:
                sub = f"{path}.{name}" if path else name
                if _is_sequence(field.annotation):
                    sub += "[]"
                members = models_in(field.annotation)
                yield from walk(child, sub, _variant(members, child) if len(members) > 1 else "")

    yield from walk(model, path, "")


def _is_sequence(annotation: Any) -> bool:
    if get_origin(annotation) in (tuple, list):
        return True
    return any(_is_sequence(a) for a in get_args(annotation) if get_origin(annotation) in (Union, types.UnionType))


def _variant(members: list[type[BaseModel]], model: type[BaseModel]) -> str:
    """`backend: megatron` for a union member tagged by a one-value Literal key all members have; else its class."""
    for name, field in model.model_fields.items():
        tags = [_tag(member.model_fields.get(name)) for member in members]
        if all(tag is not None for tag in tags):
            return f"{name}: {_tag(field)}"
    return model.__name__


def _tag(field: FieldInfo | None) -> str | None:
    values = get_args(field.annotation) if field is not None and get_origin(field.annotation) is Literal else ()
    return str(values[0]) if len(values) == 1 else None


def type_name(annotation: Any, paths: dict[type[BaseModel], str]) -> str:
    """A YAML reader's name for a type: `int`, `"a" | "b"`, `list of str`, a section by its path."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " \\| ".join(json.dumps(v) for v in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):  # a StrEnum (`RunMode`) reads as its values
        return " \\| ".join(json.dumps(m.value) for m in annotation)
    if origin in (Union, types.UnionType):  # members of one shape union are one section
        return " \\| ".join(dict.fromkeys(type_name(a, paths) for a in get_args(annotation)))
    if origin in (tuple, list):
        item = get_args(annotation)[0]
        if get_origin(item) is Annotated:  # a checked name (`ToolName`) reads as its type
            item = get_args(item)[0]
        return f"list of {type_name(item, paths)}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping {type_name(key, paths)} -> {type_name(value, paths)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"section `{paths[annotation]}`"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "its defaults"
    return f"`{json.dumps(value)}`"


def render() -> str:
    lines = [
        "# Run config reference",
        "",
        f"Generated from `trinity.config` by `{COMMAND}`; do not edit by hand.",
        "A run config is one YAML file; every key below is optional unless its default says `required`.",
        "Unknown keys are errors. Relative data paths are relative to the config file.",
    ]
    listed = list(sections())
    paths = {s.model: s.path for s in listed}
    for section in listed:
        title = section.path or "(top level)"
        lines += ["", f"## `{title}`" + (f" ({section.variant})" if section.variant else "")]
        doc = " ".join((section.model.__doc__ or "").strip().split("\n\n")[0].split())
        if doc and section.model is not RunConfig:
            lines += ["", doc]
        lines += ["", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, field in section.model.model_fields.items():
            meaning = (field.description or "").replace("|", "\\|").replace("<", "&lt;")
            lines.append(f"| `{name}` | {type_name(field.annotation, paths)} | {default_text(field)} | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
