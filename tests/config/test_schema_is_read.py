"""Nothing in the run-config schema is unread: every key is read by some component's code.

"Read" means an attribute access `<reader>.<key>` in the source of the services, the SDK, the CLI, the
algorithm library or the weight-sync layer (the config package itself does not count), where `<reader>`
names the section: the attribute the section sits under (`cfg.synchronizer.sync_interval`), a variable
bound to it (`sync = cfg.synchronizer`, `for section in buffer.eval_tasksets`, `alg, tr = ...`), or a
parameter / attribute annotated with the section's class (`config: TaskSetConfig`, then
`self.config.lease_seconds`). A key with the same name read from some other object does not count.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from pydantic import BaseModel

from trinity.config import RunConfig
from trinity.config.reference import models_in

ROOT = Path(__file__).resolve().parents[2]
READERS = ["services", "sdk", "cli", "algorithms", "weights"]
NOT_READERS = ("services/common/trinity/config/", "services/common/trinity/v1/", "/build/")

# Keys used inside the config package only, with the reason they are still a component's input.
READ_BY_THE_SCHEMA = {
    "stages": "RunConfig.stage_configs() merges them; the gateway and `trinity run` call it",
}


def _sources() -> Iterator[Path]:
    for top in READERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if not any(part in path.as_posix() for part in NOT_READERS):
                yield path


def _last_name(node: ast.expr) -> str | None:
    """`cfg.explorer` -> `explorer`, `section` -> `section`, `self.config` -> `config`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _annotation_names(node: ast.expr | None) -> set[str]:
    """`TaskSetConfig | None` -> {TaskSetConfig, None}; `config.StreamConfig` -> {config, StreamConfig}."""
    return {name for n in ast.walk(node) if (name := _last_name(n))} if node is not None else set()


@cache
def _reads() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(key -> the names it is read from, name -> the names it stands for) over every reader source."""
    reads: dict[str, set[str]] = defaultdict(set)
    aliases: dict[str, set[str]] = defaultdict(set)
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                base = _last_name(node.value)
                if base:
                    reads[node.attr].add(base)
            elif isinstance(node, ast.Assign | ast.For | ast.comprehension):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value if isinstance(node, ast.Assign) else node.iter
                for target in targets:
                    pairs = (
                        zip(target.elts, value.elts, strict=False)
                        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                        else [(target, value)]
                    )
                    for name, source in pairs:
                        alias, meant = _last_name(name), _last_name(source)
                        if alias and meant and alias != meant:
                            aliases[alias].add(meant)
            elif isinstance(node, ast.arg | ast.AnnAssign):
                alias = node.arg if isinstance(node, ast.arg) else _last_name(node.target)
                if alias:
                    aliases[alias] |= _annotation_names(node.annotation)
    return reads, aliases


def _reader_names(section: str, model: type[BaseModel]) -> set[str]:
    """The names a section goes by: its key, its class, and every alias of those (transitively)."""
    _, aliases = _reads()
    names = {section, model.__name__}
    while True:
        more = {alias for alias, meant in aliases.items() if meant & names} - names
        if not more:
            return names
        names |= more


def _leaf_keys(model: type[BaseModel], section: str = "", path: str = "") -> Iterator[tuple[str, str, type[BaseModel]]]:
    """(dotted key, the section key it sits under, its section class) for every key, union members included."""
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        yield key, section, model
        for child in models_in(field.annotation):
            yield from _leaf_keys(child, name, key)


def unread_keys() -> list[str]:
    reads, _ = _reads()
    unread = []
    for key, section, model in _leaf_keys(RunConfig):
        name = key.rsplit(".", 1)[-1]
        if key in READ_BY_THE_SCHEMA:
            continue
        if not reads.get(name, set()) & _reader_names(section or "config", model):
            unread.append(key)
    return unread


def test_every_run_config_key_is_read_by_a_component():
    assert unread_keys() == [], "keys nothing reads: wire them to the component, or remove them from the schema"


def test_a_key_only_read_from_an_unrelated_object_counts_as_unread():
    # `task.reward_fn` (a proto Task) is read by the workflows; that must not count as reading a
    # section's `reward_fn` that the explorer never looks at.
    reads, _ = _reads()
    assert "task" in reads["reward_fn"]
    assert not reads["reward_fn"] & _reader_names("explorer", RunConfig.model_fields["explorer"].annotation)
