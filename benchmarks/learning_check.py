"""The learning check: the quickstart (SmolLM2-135M-Instruct, single-digit addition) trained by each of several
presets, then examples/reasoning-gym as it ships (tasks reasoning-gym's generators make and score); held-out sampled
accuracy at every evaluation.

`make learning-check` (or `python -m benchmarks.learning_check [--presets grpo dapo ...] [--examples reasoning-gym]`)
runs them one after another with `trinity run`'s local stack and writes benchmarks/results/learning_check.json and a
markdown table of the curves; tests/e2e/test_learning_check.py (marked slow) asserts each run raises the accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from trinity.cli import preflight
from trinity.cli.commands import run_locally
from trinity.config import RunConfig, load_run_config

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "learning_check.json"
PRESETS = ("grpo", "dapo", "gspo", "rloo", "reinforceplusplus", "opmd")
# Examples run as they ship, after the presets: each is named by its folder under examples/.
EXAMPLES = ("reasoning-gym",)


def quickstart_with(preset: str) -> RunConfig:
    """The quickstart as it ships, its algorithm swapped: same model, data, budget, sampling and evaluations."""
    return with_preset(QUICKSTART, preset)


def with_preset(path: Path, preset: str) -> RunConfig:
    config = json.loads(load_run_config(path).model_dump_json())
    config["name"] = f"learning-check-{preset}"
    config["algorithm"]["algorithm_type"] = preset
    return RunConfig.model_validate(config)


def example(spec: str) -> RunConfig:
    """`name` (examples/<name> as it ships) or `name:preset` (its algorithm swapped, all else as it ships)."""
    name, _, preset = spec.partition(":")
    path = ROOT / "examples" / name / "config.yaml"
    return with_preset(path, preset) if preset else load_run_config(path)


def run_preset(config: RunConfig, output: Path, label: str = "") -> dict[str, Any]:
    """One run of `config` under `output/<label>` (default: its preset); its held-out accuracy curve, train metrics
    and wall time."""
    preset = config.algorithm.algorithm_type
    label = label or preset
    started = time.monotonic()
    exit_code = run_locally(preflight.local_run(config), str(output / label), quiet=True)
    summary = json.loads((output / label / "summary.json").read_text())
    return {
        "run": label,
        "preset": preset,
        "exit_code": exit_code,
        "state": summary["state"],
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_seconds": round(time.monotonic() - started, 1),
        "heldout_accuracy": [[row["model_version"], row["accuracy"]] for row in summary["eval"]],
        "train": summary["train"],
        "warnings": summary["warnings"],  # the consistency probe's and other checks' (none on a sound run)
    }


def markdown_table(results: list[dict[str, Any]]) -> str:
    versions = sorted({v for r in results for v, _ in r["heldout_accuracy"]})
    header = "| run | " + " | ".join(f"v{int(v)}" for v in versions) + " | wall |"
    lines = [header, "| --- " * (len(versions) + 2) + "|"]
    for result in results:
        curve = dict(result["heldout_accuracy"])
        cells = [f"{curve[v]:.3f}" if v in curve else "-" for v in versions]
        lines.append(f"| {result['run']} | " + " | ".join(cells) + f" | {result['wall_seconds']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning_check")
    parser.add_argument("--presets", nargs="*", default=list(PRESETS), help="presets to run on the quickstart")
    parser.add_argument(
        "--examples", nargs="*", default=list(EXAMPLES), help="examples to run as they ship (name, or name:preset)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "learning-check", help="run directories")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON results go")
    args = parser.parse_args(argv)
    runs = [(quickstart_with(p), p) for p in args.presets] + [
        (example(spec), spec.replace(":", "-")) for spec in args.examples
    ]
    results = []
    for config, label in runs:
        results.append(run_preset(config, args.output, label))
        args.results.parent.mkdir(parents=True, exist_ok=True)
        # Written after every run: a long check that is stopped keeps what it measured.
        record = {"quickstart": str(QUICKSTART.relative_to(ROOT)), "cpu_cores": os.cpu_count(), "runs": results}
        args.results.write_text(json.dumps(record, indent=2) + "\n")
        print(markdown_table(results), flush=True)
    failed = [r["run"] for r in results if r["exit_code"] != 0]
    if failed:
        print(f"runs that did not succeed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
