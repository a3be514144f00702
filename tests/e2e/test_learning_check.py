"""The learning check (slow: about 6 minutes a run on 2 cores): each preset trains the quickstart's
SmolLM2-135M-Instruct, and each example in benchmarks.learning_check.EXAMPLES trains as it ships, and ends with a
higher held-out accuracy than it started with. `make learning-check` runs the same runs and writes their curves
(benchmarks/learning_check.py)."""

from __future__ import annotations

import pytest

from benchmarks.learning_check import EXAMPLES, PRESETS, example, quickstart_with, run_preset


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_raises_the_quickstart_heldout_accuracy(tmp_path, preset):
    result = run_preset(quickstart_with(preset), tmp_path)
    assert result["state"] == "RUN_STATE_SUCCEEDED", result
    curve = result["heldout_accuracy"]
    assert [version for version, _ in curve] == [0.0, 4.0, 8.0, 12.0, 16.0]  # the quickstart's evaluations
    (_, first), (_, last) = curve[0], curve[-1]
    assert last > first, f"{preset}: held-out accuracy {first:.3f} -> {last:.3f}"


@pytest.mark.slow
def test_the_consistency_probe_stays_quiet_on_the_quickstart(tmp_path):
    # fp32 sampling and training, at most one version behind: no limit of monitor.consistency is passed.
    result = run_preset(example("quickstart"), tmp_path, "quickstart")
    assert result["state"] == "RUN_STATE_SUCCEEDED", result
    assert result["warnings"] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_raises_its_heldout_accuracy(tmp_path, name):
    result = run_preset(example(name), tmp_path, name)
    assert result["state"] == "RUN_STATE_SUCCEEDED", result
    (_, first), (_, last) = result["heldout_accuracy"][0], result["heldout_accuracy"][-1]
    assert last > first, f"{name}: held-out accuracy {first:.3f} -> {last:.3f}"
