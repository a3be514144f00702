"""The console page in Debian's headless chromium (Playwright drives it), against a real stack: Redis, gateway,
buffer, trainer and a vLLM explorer as processes, and the console server as one more (the local launcher starts
them all, as `trinity run --console` does). Screenshots and timings go to an artifacts folder
(`TRINITY_TEST_ARTIFACTS`, default runs/test-artifacts/browser); with `TRINITY_CONSOLE_SCREENSHOTS=docs/console` the
final screenshots are copied there for the docs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, Locator, Page, sync_playwright

from tests.e2e.conftest import tiny_config
from trinity.cli.launcher import LocalStack

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("TRINITY_CHROMIUM", "/usr/bin/chromium"))
VENDOR = REPO / "services/console/trinity/console/static/vendor"


@dataclass(frozen=True)
class Console:
    """The console of a stack (`LocalStack.add_console`: what `trinity run --console` starts), by its URL."""

    url: str

    def api(self, path: str) -> dict:
        return httpx.get(self.url + path, timeout=10).raise_for_status().json()

    def post(self, path: str) -> dict:
        return httpx.post(self.url + path, timeout=30).raise_for_status().json()


class Artifacts:
    """Where screenshots and measurements land; `publish` copies the final screenshots for the docs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.docs = os.environ.get("TRINITY_CONSOLE_SCREENSHOTS")

    def screenshot(
        self, page: Page, name: str, *, full_page: bool = False, publish: bool = False, element: Locator | None = None
    ) -> Path:
        """The page (the viewport, or all of it with `full_page`), or only `element`."""
        path = self.root / f"{name}.png"
        if element is not None:
            element.screenshot(path=str(path))
        else:
            page.screenshot(path=str(path), full_page=full_page)
        if publish and self.docs:
            target = REPO / self.docs if not Path(self.docs).is_absolute() else Path(self.docs)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / path.name)
        return path

    def write_json(self, name: str, data: dict) -> Path:
        path = self.root / name
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path


@pytest.fixture(scope="session")
def artifacts() -> Artifacts:
    return Artifacts(Path(os.environ.get("TRINITY_TEST_ARTIFACTS", REPO / "runs/test-artifacts")) / "browser")


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    stack = LocalStack.up(tmp_path_factory.mktemp("browser-stack") / "logs", explorers=1)
    yield stack
    stack.down()


@pytest.fixture(scope="session")
def console(stack: LocalStack) -> Console:
    if not (VENDOR / "uplot.js").is_file():
        pytest.fail(f"the page's vendored code is missing ({VENDOR}); it is in git: restore it (`git checkout`)")
    return Console(stack.add_console(0))  # stopped with the stack


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (Debian's), or set TRINITY_CHROMIUM")
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context per test (no shared cookies or storage); page errors fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    yield page
    context.close()
    assert not errors, f"the page raised: {errors}"


def run_yaml(model: Path, **overrides) -> str:
    """A run config for the tiny model as the YAML editor takes it."""
    return yaml.safe_dump(tiny_config(model, **overrides), sort_keys=False)
