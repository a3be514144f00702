"""examples/gsm8k as it ships, on a CPU: a tiny model in place of Qwen2.5-1.5B-Instruct and a generated dataset in
GSM8K's format and the Hub's folder layout in place of the real one; everything else is the example's own config.
A whole `trinity run` (every service a process): marked `system`."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.e2e.conftest import write_config

pytestmark = pytest.mark.system

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k" / "config.yaml"
# The dataset card's front matter, as openai/gsm8k has it: two configs, each with a train and a test split.
CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
"""


def _gsm8k_row(rng: random.Random) -> dict[str, str]:
    """A word problem with a GSM8K-style solution: calculator annotations, then `#### <answer>`."""
    a, b, price = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
    total = (a + b) * price
    return {
        "question": f"Ana buys {a} pens and {b} pencils. Each costs ${price}. How many dollars does she spend?",
        "answer": f"She buys {a} + {b} = <<{a}+{b}={a + b}>>{a + b} items.\n"
        f"They cost {a + b} * {price} = <<{a + b}*{price}={total}>>{total} dollars.\n#### {total:,}",
    }


def write_gsm8k_snapshot(folder: Path, seed: int = 0) -> Path:
    """GSM8K's Hub layout: README.md with the configs, `<config>/<split>-00000-of-00001.parquet`."""
    rng = random.Random(seed)
    for config, rows in (("main", {"train": 64, "test": 16}), ("socratic", {"train": 8, "test": 4})):
        (folder / config).mkdir(parents=True, exist_ok=True)
        for split, count in rows.items():
            table = pa.Table.from_pylist([_gsm8k_row(rng) for _ in range(count)])
            pq.write_table(table, folder / config / f"{split}-00000-of-00001.parquet")
    (folder / "README.md").write_text(CARD)
    return folder


def test_the_gsm8k_example_runs_to_success_on_a_tiny_model(tiny_model, tmp_path):
    config = yaml.safe_load(EXAMPLE.read_text())
    write_gsm8k_snapshot(tmp_path / "data" / "gsm8k")
    # The model, the data's place and the size of the run change; the recipe (task sets, subset, splits, template,
    # reward, algorithm, precision settings) is the example's.
    config["model"].update(path=str(tiny_model), max_prompt_tokens=256, max_response_tokens=8)
    config["buffer"].update(batch_size=2, total_steps=2)
    config["algorithm"]["repeat_times"] = 4
    config["buffer"]["eval_tasksets"][0]["limit"] = 4
    config["explorer"]["eval_interval"] = 2
    # CUDA graphs do not exist on a CPU; the CPU build would compile the model instead (minutes here).
    config["explorer"]["engine_options"]["enforce_eager"] = True
    config["trainer"]["micro_batch_tokens"] = 2048
    path = write_config(tmp_path / "config.yaml", config)  # data/gsm8k is relative to it, as in the example

    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(path), "--output", str(tmp_path / "out")]
    done = subprocess.run(
        [*command, "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = "\n".join(p.read_text()[-3000:] for p in sorted((tmp_path / "out" / "logs").glob("*.log")))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["state"] == "RUN_STATE_SUCCEEDED", summary["error"]
    assert [row["step"] for row in summary["train"]] == [1, 2]
    # The test split of the `main` subset, evaluated at the start and at the end.
    assert [row["model_version"] for row in summary["eval"]] == [0, 2], summary["eval"]
    assert all("accuracy/gsm8k-test" in row for row in summary["eval"]), summary["eval"]
