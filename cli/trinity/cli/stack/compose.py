"""Read docker-compose files the way `docker compose` does: YAML, `${VAR:-default}` interpolation, overrides.

Only what Trinity's own compose files use is supported; anything else is left as plain data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# `$$` is a literal dollar; `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME:+alt}`; `$NAME`.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)
# Sequences that an override file extends instead of replacing (the compose specification's merge rules).
_APPENDED_SEQUENCES = {"ports", "expose", "volumes", "dns", "extra_hosts", "devices", "cap_add", "cap_drop"}


class ComposeError(ValueError):
    """A compose file that cannot be read, interpolated or planned; the message names the place."""


def interpolate_text(text: str, env: Mapping[str, str], where: str = "") -> str:
    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        op, arg = match["op"], match["arg"] or ""
        value = env.get(name)
        if op is None:
            return value or ""
        unset_or_empty = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if unset_or_empty else str(value)
        if op.endswith("?"):
            if unset_or_empty:
                raise ComposeError(f"{where}: required variable {name} is missing: {arg or 'set it'}")
            return str(value)
        return "" if unset_or_empty else arg  # `+`: the alternative when set

    return _VARIABLE.sub(replace, text)


def interpolate(data: Any, env: Mapping[str, str], where: str = "") -> Any:
    """Interpolate every string in `data` (keys stay literal, as in compose)."""
    if isinstance(data, str):
        return interpolate_text(data, env, where)
    if isinstance(data, list):
        return [interpolate(item, env, f"{where}[{i}]") for i, item in enumerate(data)]
    if isinstance(data, dict):
        return {key: interpolate(value, env, f"{where}.{key}" if where else str(key)) for key, value in data.items()}
    return data


def merge(base: Any, override: Any, key: str = "") -> Any:
    """An override file on top of a base: mappings merge, some sequences append, everything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            merged[name] = merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and key in _APPENDED_SEQUENCES:
        return base + [item for item in override if item not in base]
    return override


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ComposeError(f"{path}: no such compose file") from None
    except yaml.YAMLError as err:
        raise ComposeError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ComposeError(f"{path}: a compose file is a mapping with a `services` key")
    # `x-*` keys hold YAML anchors only; PyYAML has already expanded them where they are used.
    return {key: value for key, value in data.items() if not str(key).startswith("x-")}


def load_compose(files: list[Path], env: Mapping[str, str]) -> dict[str, Any]:
    """The merged, interpolated compose model of `files` (first is the base, later ones override)."""
    if not files:
        raise ComposeError("no compose file given")
    model: dict[str, Any] = {}
    for path in files:
        model = merge(model, interpolate(read_yaml(path), env, path.name))
    if not isinstance(model.get("services"), dict) or not model["services"]:
        raise ComposeError(f"{files[0]}: no services defined")
    return model
