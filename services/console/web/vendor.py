"""Vendor the console page's third-party browser code into the console package, from `node_modules` after `npm ci`.

Copies each file below into `trinity/console/static/vendor/` (in git, so every install of the console ships it: a
wheel, an sdist, an image, an editable checkout) with the packages' licences, and writes `vendor/SOURCES.json`: for
each file its npm package, the version package-lock.json pins, its path inside the package and its sha256.
`make console-assets` runs it after a change of package-lock.json; tests/console/test_console_assets.py checks the
files against the manifest and the manifest against the lock. `.js` names: module scripts need a JavaScript MIME
type, which `.mjs` may lack.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

WEB = Path(__file__).resolve().parent
VENDOR = WEB.parent / "trinity" / "console" / "static" / "vendor"
# vendored name -> (npm package, file inside the package)
FILES = {
    "uplot.js": ("uplot", "dist/uPlot.esm.js"),
    "uplot.css": ("uplot", "dist/uPlot.min.css"),
    "uplot.LICENSE": ("uplot", "LICENSE"),
    "js-yaml.js": ("js-yaml", "dist/browser/js-yaml.esm.min.mjs"),
    "js-yaml.LICENSE": ("js-yaml", "LICENSE"),
}


def locked_versions(lock: Path = WEB / "package-lock.json") -> dict[str, str]:
    """npm package -> the version package-lock.json pins."""
    packages = json.loads(lock.read_text())["packages"]
    return {path.removeprefix("node_modules/"): entry["version"] for path, entry in packages.items() if path}


def main() -> int:
    versions = locked_versions()
    sources = {}
    for name, (package, inner) in FILES.items():
        root = WEB / "node_modules" / package
        installed = json.loads((root / "package.json").read_text())["version"]
        if installed != versions[package]:
            print(f"{root} is {installed}, the lock pins {versions[package]}: run npm ci first", file=sys.stderr)
            return 1
        VENDOR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / inner, VENDOR / name)
        digest = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
        sources[name] = {"package": package, "version": installed, "file": inner, "sha256": digest}
    (VENDOR / "SOURCES.json").write_text(json.dumps(sources, indent=2) + "\n")
    print(f"vendored {len(sources)} files into {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
