"""One name -> object registry for every extension point (algorithms, workflows, rewards, operators, ...).

A registry knows its built-in names before anything is imported: `trinity.registry_names` maps each
name to the module that defines it, and the first `get(name)` imports that module, which registers the
object with the `register` decorator. Packages add names without editing Trinity through the entry-point
group of the kind (`trinity.workflows`, `trinity.rewards`, ...)::

    [project.entry-points."trinity.workflows"]
    echo = "my_pkg.workflows"                 # importing the module registers `echo`
    shout = "my_pkg.workflows:ShoutWorkflow"  # or: the object itself, registered under `shout`

Entry points are read from package metadata and loaded on first use too, so `check_name` validates a
config's names (built-in or installed) without importing any service code or torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

from trinity.registry_names import KINDS

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name no registry entry, built-in or plugin, has; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str], hint: str = "") -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        message = f"unknown {_label(kind)} {name!r}; known: {', '.join(self.known) or '(none)'}"
        self.message = f"{message}; {hint}" if hint else message
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would repr() the message and add quotes
        return self.message


class DuplicateNameError(ValueError):
    """A second registration (or entry point) under a name already taken."""


class Registry(Generic[T]):
    """Config names -> objects of one kind; `register(name)` is the decorator that adds one.

    `builtins` (name -> module) and `group` (the entry-point group) default to the kind's row in
    `trinity.registry_names`; a kind that is not there (a test's throwaway registry) starts empty.
    """

    def __init__(self, kind: str, *, builtins: Mapping[str, str] | None = None, group: str | None = None) -> None:
        row = KINDS.get(kind)
        self.kind = kind
        self.label = _label(kind)  # for messages: "policy loss"
        self.builtins: Mapping[str, str] = builtins if builtins is not None else (row.builtins if row else {})
        self.group = group if group is not None else (row.group if row else "")
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the object under `name`; a name already taken is an error."""

        def decorator(obj: T) -> T:
            if not name or not isinstance(name, str):
                raise ValueError(f"{self.label} name must be a non-empty string, got {name!r}")
            if name in self._entries:
                raise DuplicateNameError(
                    f"{self.label} {name!r} is already registered by {self._entries[name]!r}; pick another name"
                )
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """The object registered as `name`, importing its built-in module or plugin on first use."""
        if name not in self._entries:
            self._load(name)
        return self._entries[name]

    def names(self) -> list[str]:
        """Every name this registry can resolve (built-in, installed plugins, registered), sorted."""
        return sorted({*self.builtins, *_plugins(self.group, tuple(self.builtins)), *self._entries})

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name in self._entries or name in self.builtins or name in _plugins(self.group, tuple(self.builtins))

    def _load(self, name: str) -> None:
        if name in self.builtins:
            source = f"module {self.builtins[name]!r}"
            importlib.import_module(self.builtins[name])
        elif (point := _plugins(self.group, tuple(self.builtins)).get(name)) is not None:
            source = f"entry point {point.name} = {point.value!r} (group {self.group!r})"
            obj = point.load()
            if point.attr and name not in self._entries:  # `module:object` names the object itself
                self.register(name)(obj)
        else:
            hint = f"a plugin package adds names through the entry-point group {self.group!r}" if self.group else ""
            raise UnknownNameError(self.kind, name, self.names(), hint)
        if name not in self._entries:
            raise LookupError(f"{source} was loaded for {self.label} {name!r} but did not register it")


def check_name(kind: str, name: str, *, also: Iterable[str] = ()) -> str:
    """`name` if it is a built-in or installed `kind` name (or one of `also`), for config validators.

    Imports nothing but package metadata. The message names no field: pydantic puts the field in front
    (`algorithm.algorithm_type: unknown 'grpoo'; known: ...`).
    """
    row = KINDS[kind]
    known = {*row.builtins, *_plugins(row.group, tuple(row.builtins)), *also}
    if name not in known:
        raise ValueError(f"unknown {name!r}; known: {', '.join(sorted(known))}")
    return name


@cache
def _plugins(group: str, builtins: tuple[str, ...]) -> Mapping[str, EntryPoint]:
    """The installed entry points of `group` by name (cached: package metadata does not change while a
    process runs); a plugin may neither reuse a built-in name nor declare a name another plugin has."""
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=group) if group else ():
        if point.name in builtins:
            raise DuplicateNameError(
                f"entry point {point.name} = {point.value!r} (group {group!r}) reuses a built-in name; "
                "rename it in the plugin's pyproject.toml"
            )
        if point.name in found and found[point.name].value != point.value:
            raise DuplicateNameError(
                f"entry points {found[point.name].value!r} and {point.value!r} (group {group!r}) both declare "
                f"{point.name!r}; rename one in its package's pyproject.toml"
            )
        found[point.name] = point
    return found


def _label(kind: str) -> str:
    return kind.replace("_", " ")
