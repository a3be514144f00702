"""Read the instructions of a Dockerfile (continuations joined) for the deployment tests."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]

    def env(self) -> dict[str, str]:
        """ENV key=value pairs in order (later ones win), unexpanded."""
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                values[key] = value
        return values

    def exec_form(self, keyword: str) -> list[str]:
        """The JSON (exec) form of the last ENTRYPOINT/CMD-like instruction; shell form is an error."""
        args = self.all(keyword)[-1]
        if keyword == "HEALTHCHECK":
            args = args[args.index("CMD") + len("CMD") :]
        parsed = json.loads(args)
        assert isinstance(parsed, list), f"{keyword} must use the exec form"
        return [str(part) for part in parsed]


def parse(path: Path) -> list[Stage]:
    stages: list[Stage] = [Stage("(global)")]
    logical = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, args = logical.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            parts = args.split()
            stages.append(Stage(parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))))
        stages[-1].instructions.append((keyword, args))
        logical = ""
    return stages
