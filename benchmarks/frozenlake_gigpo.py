"""GiGPO against multi-step GRPO on FrozenLake: the same run, seed and steps, only `algorithm_type` swapped.

`python -m benchmarks.frozenlake_gigpo` trains SmolLM2-135M-Instruct on generated 2x2 FrozenLake maps (every
episode of a task starts in the same state, and later states repeat across its episodes), evaluates held-out maps
(the share of episodes won) at the start, every 4 versions or so and at the end, and writes
benchmarks/results/frozenlake_gigpo.json: each preset's held-out success curve and, per train step, the mean reward
and `advantage/within_episode_std`, the spread of the advantages of one episode's steps: 0 when every step gets its
episode's score (multi-step GRPO), above 0 when GiGPO's step-level term tells steps taken from the same state apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.learning_check import ROOT, markdown_table, run_preset
from trinity.config import RunConfig, load_run_config

EXAMPLE = ROOT / "examples" / "frozenlake" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "frozenlake_gigpo.json"
PRESETS = ("gigpo", "multi_step_grpo")
# SmolLM2-135M scored 0 on every held-out sample of examples/frozenlake's 4x4 maps (96) and of 3x3 maps (370), and
# every train reward of 8 steps on 3x3 maps was 0 (so every advantage 0): the 2x2 maps give it some returns.
MAP_SIZE = 2


def write_maps(path: Path, seeds: range) -> Path:
    """FrozenLake tasks of random solvable `MAP_SIZE` maps (gymnasium's generator), one per seed."""
    rows = [{"prompt": "FrozenLake", "size": MAP_SIZE, "map_seed": s, "is_slippery": False} for s in seeds]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def frozenlake_with(preset: str, data: Path) -> RunConfig:
    """examples/frozenlake as it ships, on `MAP_SIZE` maps (64 to train on, 16 held out), with `preset`."""
    config = json.loads(load_run_config(EXAMPLE).model_dump_json())
    config["name"] = f"frozenlake-{preset}"
    config["algorithm"]["algorithm_type"] = preset
    config["buffer"]["taskset"]["path"] = str(write_maps(data / "train.jsonl", range(64)))
    config["buffer"]["eval_tasksets"][0]["path"] = str(write_maps(data / "eval.jsonl", range(1000, 1016)))
    return RunConfig.model_validate(config)


def step_metrics(result: dict[str, Any]) -> list[dict[str, float]]:
    keys = ("step", "reward/mean", "advantage/within_episode_std", "step_seconds")
    return [{k: row[k] for k in keys if k in row} for row in result.pop("train")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.frozenlake_gigpo")
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "frozenlake-gigpo", help="run directories")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON results go")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    results = []
    for preset in PRESETS:
        result = run_preset(frozenlake_with(preset, args.output), args.output)
        result["steps"] = step_metrics(result)
        results.append(result)
        args.results.parent.mkdir(parents=True, exist_ok=True)
        record = {"example": str(EXAMPLE.relative_to(ROOT)), "map_size": MAP_SIZE, "cpu_cores": os.cpu_count()}
        args.results.write_text(json.dumps({**record, "runs": results}, indent=2) + "\n")
        print(markdown_table(results), flush=True)
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
