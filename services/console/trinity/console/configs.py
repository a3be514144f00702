"""What the config form needs: the run-config schema, the registry names, the example configs, and validation
with the CLI's own messages and checks (`trinity.config.resolved_run`, as `trinity check` and the gateway run them)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from trinity.config import ConfigError, RunConfig, parse_run_config
from trinity.config.resolved import resolved_run
from trinity.registry import Registry
from trinity.registry_names import KINDS

# A line of a config error is `<dotted field>: <message>` (trinity.config.errors), or a message alone.
_FIELD_LINE = re.compile(r"(?P<field>[A-Za-z_][\w.\[\]-]*): (?P<message>.*)", re.DOTALL)


def problems(err: ConfigError) -> list[dict[str, str]]:
    """A config error as the form shows it: one `{"field", "message"}` per problem the CLI prints (a line each;
    the lines of a YAML syntax error, which name no field, make one problem)."""
    out: list[dict[str, str]] = []
    for line in str(err).splitlines():
        match = _FIELD_LINE.fullmatch(line)
        if match:
            out.append({"field": match["field"], "message": match["message"]})
        elif out and not out[-1]["field"]:
            out[-1]["message"] += "\n" + line
        else:
            out.append({"field": err.field, "message": line})
    return out


def validate(text: str) -> tuple[RunConfig | None, list[dict[str, str]]]:
    """The config, or the problems with it: `trinity check --remote`'s check (`resolved_run`: every stage, what the
    preset needs from the workflow), as the gateway makes it."""
    try:
        config = parse_run_config(text)
        resolved_run(config)
    except ConfigError as err:
        return None, problems(err)
    return config, []


@cache
def schema() -> dict[str, Any]:
    return RunConfig.model_json_schema()


def registries() -> dict[str, list[str]]:
    """Every registry kind's names, built-in and installed plugins (what the config's validators accept)."""
    return {kind: Registry(kind).names() for kind in KINDS}


# `path: train.jsonl` (a task set's, offline data's, a model's): a relative path, as an example file writes it.
_PATH_LINE = re.compile(r"^(?P<key>\s*(?:-\s+)?path:\s*)(?P<path>[^\s#'\"]+)", re.MULTILINE)


def examples(root: Path | None) -> list[dict[str, str]]:
    """`<root>/<name>/config.yaml` of each example, by name, its comments kept. A config file's relative data
    paths are relative to the file (`load_run_config`); a config sent as text has no file, so the paths that
    name files beside it are written out in full."""
    if root is None:
        return []
    out = []
    for path in sorted(root.glob("*/config.yaml")):
        base = path.parent.resolve()

        def absolute(match: re.Match[str], base: Path = base) -> str:
            target = base / match["path"]
            return match["key"] + str(target) if not Path(match["path"]).is_absolute() and target.exists() else match[0]

        out.append({"name": path.parent.name, "yaml": _PATH_LINE.sub(absolute, path.read_text())})
    return out
