"""The console's third-party page code ships with every install of it: vendored in the package (in git), the files the
npm lock pins, inside a built wheel and served from it; a console without them says so in its log and on its page."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from structlog.testing import capture_logs

from trinity.console import app as console_app
from trinity.console.app import LOADING, VENDOR_ASSETS, create_app
from trinity.console.settings import ConsoleSettings

CONSOLE = Path(__file__).resolve().parents[2] / "services" / "console"
WEB = CONSOLE / "web"
VENDOR = CONSOLE / "trinity" / "console" / "static" / "vendor"
NO_GATEWAY = ConsoleSettings(gateway="127.0.0.1:1")  # the page and its files need no gateway


def _sources() -> dict[str, dict[str, str]]:
    return json.loads((VENDOR / "SOURCES.json").read_text())


def test_the_vendored_files_are_the_ones_the_npm_lock_pins() -> None:
    sources = _sources()
    locked = json.loads((WEB / "package-lock.json").read_text())["packages"]
    assert set(VENDOR_ASSETS) <= set(sources)
    for name, source in sources.items():
        data = (VENDOR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == source["sha256"], f"{name} differs from SOURCES.json"
        assert source["version"] == locked[f"node_modules/{source['package']}"]["version"], name
        assert json.loads((WEB / "package.json").read_text())["dependencies"][source["package"]] == source["version"]
        installed = WEB / "node_modules" / source["package"] / source["file"]
        if installed.is_file():  # after `npm ci` (make console-assets): the very bytes npm installed
            assert installed.read_bytes() == data, name
    assert {s["package"] for s in sources.values()} == {"uplot", "js-yaml"}
    assert "uplot.LICENSE" in sources and "js-yaml.LICENSE" in sources  # MIT: the notices travel with the code


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The console as a wheel built from its source folder (`pip wheel --no-deps`) and unpacked: an install path."""
    tmp = tmp_path_factory.mktemp("console-wheel")
    source = tmp / "console"
    skipped = shutil.ignore_patterns("node_modules", "*.egg-info", "build", "__pycache__")
    shutil.copytree(CONSOLE, source, ignore=skipped)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(source)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp.glob("trinity_console-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp / "site")
    return tmp / "site"


@pytest.mark.system  # builds the wheel (pip): make test-system
def test_a_built_console_wheel_holds_the_vendored_files(installed: Path) -> None:
    vendor = installed / "trinity" / "console" / "static" / "vendor"
    for name in _sources():
        assert (vendor / name).read_bytes() == (VENDOR / name).read_bytes(), name
    assert (installed / "trinity" / "console" / "static" / "index.html").is_file()


@pytest.mark.system  # builds the wheel (pip): make test-system
def test_the_console_installed_from_its_wheel_serves_its_page_and_the_vendored_files(installed: Path) -> None:
    probe = textwrap.dedent(
        """
        import sys
        from fastapi.testclient import TestClient
        from trinity.console.app import STATIC, create_app
        from trinity.console.settings import ConsoleSettings
        assert str(STATIC).startswith(sys.argv[1]), STATIC  # the installed copy, not the checkout
        with TestClient(create_app(ConsoleSettings(gateway="127.0.0.1:1"))) as client:
            for path in ("/", "/static/vendor/uplot.js", "/static/vendor/uplot.css", "/static/vendor/js-yaml.js"):
                got = client.get(path)
                print(path, got.status_code, got.headers["content-type"].split(";")[0], "Loading" in got.text)
        """
    )
    env = {"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(installed)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "/ 200 text/html True",
        "/static/vendor/uplot.js 200 text/javascript False",
        "/static/vendor/uplot.css 200 text/css False",
        "/static/vendor/js-yaml.js 200 text/javascript False",
    ]


def test_a_console_missing_its_vendored_files_says_so_in_its_log_and_on_its_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    static = tmp_path / "static"
    shutil.copytree(VENDOR.parent, static, ignore=shutil.ignore_patterns("vendor"))
    monkeypatch.setattr(console_app, "STATIC", static)

    with capture_logs() as logs, TestClient(create_app(NO_GATEWAY)) as client:
        page = client.get("/")
        library = client.get("/static/vendor/uplot.js")

    [warning] = [entry for entry in logs if entry["event"] == "console.assets_missing"]
    assert warning["missing"] == ["vendor/uplot.js", "vendor/uplot.css", "vendor/js-yaml.js"]
    assert page.status_code == 500 and LOADING not in page.text
    assert 'id="assets-missing"' in page.text and "vendor/uplot.js, vendor/uplot.css, vendor/js-yaml.js" in page.text
    assert "reinstall" in page.text and library.status_code == 404


def test_a_complete_console_loads_its_page_as_written() -> None:
    with capture_logs() as logs, TestClient(create_app(NO_GATEWAY)) as client:
        page = client.get("/")
    assert page.status_code == 200 and LOADING in page.text
    assert not [entry for entry in logs if entry["event"] == "console.assets_missing"]
