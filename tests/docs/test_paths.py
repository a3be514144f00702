"""The docs point only at files a clone has: every relative link and every repository path in backticks exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("deploy/**/*.md"), *ROOT.glob("examples/**/*.md")]
)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A backticked path that starts at one of the repository's top-level folders, e.g. `services/buffer/Dockerfile`.
TOP = "|".join(sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")))
CODE_PATH = re.compile(rf"`((?:{TOP})/[A-Za-z0-9_./*-]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page):
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert resolved.exists(), f"{page.name} links to a missing file: {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_in_backticks_exist(page):
    for path in CODE_PATH.findall(page.read_text()):
        if "*" in path or path.startswith(("runs/", "benchmarks/results/")):  # globs and run outputs
            continue
        assert (ROOT / path.rstrip("/")).exists(), f"{page.name} names a path a clone does not have: {path}"
