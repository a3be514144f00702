"""The quickstart as it ships, watched through the console: a screenshot of its timeline panel late in the run
(docs/console/timeline-quickstart.png) and, from the run's timeline.json, the median step and the share of each lane
spent in each phase. Also the consistency probe's warnings on the quickstart (there should be none).

`python -m benchmarks.quickstart_timeline [--screenshot PATH] [--at-step N]` starts `trinity run --console` as a child
process and drives Debian's chromium with Playwright while the run goes on; writes
benchmarks/results/quickstart_timeline.json. Run it alone: the step times are the quiet machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import write_result

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart" / "config.yaml"
CHROMIUM = Path(os.environ.get("TRINITY_CHROMIUM", "/usr/bin/chromium"))


def api(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}/{path}", timeout=10) as response:
        return json.loads(response.read())


def console_url(process: subprocess.Popen[str], timeout: float = 300.0) -> str:
    """The URL `trinity run --console` prints before the run starts."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"trinity run ended before printing the console's URL (exit {process.wait()})")
        if line.startswith("console at "):
            return line.removeprefix("console at ").strip().rstrip("/")
    raise RuntimeError(f"no console URL within {timeout:.0f}s")


def wait_for_step(base: str, step: int, timeout: float = 1800.0) -> str:
    """The run's id once its trainer has reached `step`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = api(base, "api/runs")["runs"]
        if runs and runs[0]["train_step"] >= step:
            return str(runs[0]["id"])
        time.sleep(1.0)
    raise RuntimeError(f"the run did not reach step {step} within {timeout:.0f}s")


def screenshot_timeline(base: str, run_id: str, path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: chromium's sandbox refuses to start as root
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}/#/runs/{run_id}")
            page.wait_for_selector("#timeline g[data-phase]", timeout=60_000)
            page.wait_for_timeout(1500)  # the newest step's bars, drawn from the event that just arrived
            page.locator("section", has=page.locator("#timeline")).screenshot(path=str(path))
        finally:
            browser.close()


def phase_shares(spans: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per lane (`source`, the sync lane apart), the share of the train steps' wall time in each phase."""
    seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for span in spans:
        if span["step"] == 0:  # the start-up
            continue
        lane = span["source"].split("/")[0]
        seconds[lane][span["phase"]] += (span["end_unix_ms"] - span["start_unix_ms"]) / 1e3
    return {
        lane: {phase: round(s / sum(phases.values()), 3) for phase, s in sorted(phases.items(), key=lambda p: -p[1])}
        for lane, phases in seconds.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quickstart_timeline")
    parser.add_argument("--screenshot", type=Path, default=ROOT / "docs" / "console" / "timeline-quickstart.png")
    parser.add_argument("--at-step", type=int, default=12, help="the train step at which to take the screenshot")
    args = parser.parse_args(argv)
    output = Path(tempfile.mkdtemp(prefix="quickstart-timeline-"))
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(QUICKSTART), "--output", str(output)]
    command += ["--console", "--console-port", "0", "--quiet"]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        base = console_url(process)
        run_id = wait_for_step(base, args.at_step)
        screenshot_timeline(base, run_id, args.screenshot)
        exit_code = process.wait(timeout=1800)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)
    summary = json.loads((output / "summary.json").read_text())
    spans = json.loads((output / "timeline.json").read_text())["spans"]
    step_seconds = [row["step_seconds"] for row in summary["train"] if "step_seconds" in row]
    result = {
        "config": str(QUICKSTART.relative_to(ROOT)),
        "exit_code": exit_code,
        "state": summary["state"],
        "wall_seconds": round(time.monotonic() - started, 1),
        "median_step_seconds": round(statistics.median(step_seconds), 2),
        "step_seconds": [round(s, 2) for s in step_seconds],
        "heldout_accuracy": [[row["model_version"], row["accuracy"]] for row in summary["eval"]],
        "probe_warnings": summary["warnings"],
        "phase_shares": phase_shares(spans),
        "screenshot": str(args.screenshot.relative_to(ROOT)) if args.screenshot.is_relative_to(ROOT) else "",
    }
    print(json.dumps(result, indent=1))
    write_result("quickstart_timeline", result)
    return 0 if exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
