"""Nothing in the run-config schema is unread: every key is read by some component's code.

"Read" means an attribute access `<reader>.<key>` in the source of the services, the SDK, the CLI, the
algorithm library or the weight-sync layer (the config package itself does not count), where `<reader>`
names the section: the attribute the section sits under (`cfg.synchronizer.sync_interval`), a variable
bound to it (`sync = cfg.synchronizer`, `for section in buffer.eval_tasksets`, `alg, tr = ...`), or a
parameter / attribute annotated with the section's class (`config: TaskSetConfig`, then
`self.config.lease_seconds`). A key with the same name read from some other object does not count.
A section handed over whole as keyword arguments (`Engine(**options.model_dump())`) is read key by key
by the receiver: there a key counts as read when a parameter or a declared field of that name exists.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from trinity.config import ExplorerConfig, RunConfig, TaskSetConfig
from trinity.config.reference import models_in

ROOT = Path(__file__).resolve().parents[2]
READERS = ["services", "sdk", "cli", "algorithms", "weights"]
NOT_READERS = ("services/common/trinity/config/", "services/common/trinity/v1/", "/build/")

# Keys used inside the config package only, with the reason they are still a component's input.
READ_BY_THE_SCHEMA = {
    "buffer.train_batch_size": "RunConfig.train_batch_size resolves it (None = batch_size * repeat_times)",
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


def _meant(node: ast.expr) -> set[str]:
    """What a bound value stands for: `cfg.explorer` -> explorer, `Config(...)` -> Config, `a or B(...)` -> both."""
    if isinstance(node, ast.BoolOp | ast.IfExp):
        parts = node.values if isinstance(node, ast.BoolOp) else [node.body, node.orelse]
        return set().union(*(_meant(part) for part in parts))
    name = _last_name(node.func if isinstance(node, ast.Call) else node)
    return {name} if name else set()


def _dumped(node: ast.AST) -> str | None:
    """`options` for `options.model_dump(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "model_dump":
        return _last_name(node.func.value)
    return None


def _annotation_names(node: ast.expr | None) -> set[str]:
    """`TaskSetConfig | None` -> {TaskSetConfig, None}; `config.StreamConfig` -> {config, StreamConfig}."""
    return {name for n in ast.walk(node) if (name := _last_name(n))} if node is not None else set()


@dataclass(frozen=True)
class Reads:
    attributes: dict[str, set[str]]  # key -> the names it is read from (`sync.sync_interval`: sync)
    aliases: dict[str, set[str]]  # name -> the names it stands for (`sync = cfg.synchronizer`: synchronizer)
    dumped: set[str]  # names whose `.model_dump()` is taken (handed over as keyword arguments)
    parameters: set[str]  # parameter names and declared (annotated) field names


@cache
def _reads() -> Reads:
    """Every attribute read, alias, dump and parameter in the reader sources."""
    reads: dict[str, set[str]] = defaultdict(set)
    aliases: dict[str, set[str]] = defaultdict(set)
    dumped: set[str] = set()
    parameters: set[str] = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if name := _dumped(node):
                dumped.add(name)
            if isinstance(node, ast.arg):
                parameters.add(node.arg)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                parameters.add(node.target.id)
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
                        if alias := _last_name(name):
                            aliases[alias] |= _meant(source) - {alias}
            elif isinstance(node, ast.ClassDef):  # a subclass of a section reads the section's keys
                aliases[node.name] |= {name for base in node.bases if (name := _last_name(base))}
            elif isinstance(node, ast.arg | ast.AnnAssign):
                alias = node.arg if isinstance(node, ast.arg) else _last_name(node.target)
                if alias:
                    aliases[alias] |= _annotation_names(node.annotation)
    return Reads(reads, aliases, dumped, parameters)


def _reader_names(section: str, model: type[BaseModel]) -> set[str]:
    """The names a section goes by: its key, its class, and every alias of those (transitively)."""
    aliases = _reads().aliases
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


def unread_keys(read_by_the_schema: Mapping[str, str] = READ_BY_THE_SCHEMA) -> list[str]:
    reads = _reads()
    unread: list[str] = []
    for key, section, model in _leaf_keys(RunConfig):
        name = key.rsplit(".", 1)[-1]
        readers = _reader_names(section or "config", model)
        read = bool(reads.attributes.get(name, set()) & readers)
        as_keyword = bool(reads.dumped & readers) and name in reads.parameters
        if not (read or as_keyword or key in read_by_the_schema or key in unread):
            unread.append(key)
    return unread


def test_every_run_config_key_is_read_by_a_component():
    assert unread_keys() == [], "keys nothing reads: wire them to the component, or remove them from the schema"


@pytest.mark.parametrize(
    ("key", "section", "model"),
    [
        # Removed as unread: `task.reward_fn` (a proto Task) is read by the workflows, not explorer.reward_fn;
        ("reward_fn", "explorer", ExplorerConfig),
        # and `cfg.explorer.workflow` picks the workflow, not a task set's `workflow`.
        ("workflow", "taskset", TaskSetConfig),
    ],
)
def test_a_key_read_only_from_other_objects_counts_as_unread(key, section, model):
    reads = _reads().attributes[key]
    assert reads, f"some object's `.{key}` is read (else this test shows nothing)"
    assert not reads & _reader_names(section, model)


def test_the_read_by_the_schema_list_holds_only_keys_no_component_reads():
    keys = {key for key, _, _ in _leaf_keys(RunConfig)}
    assert set(READ_BY_THE_SCHEMA) <= keys, "a listed key is not in the schema any more"
    unread = set(unread_keys(read_by_the_schema={}))
    assert unread >= set(READ_BY_THE_SCHEMA), "a listed key is read by a component now: drop it from the list"
