"""benchmarks/bench_e2e.py: which TRL configuration ours is measured against, and how configurations are named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_e2e import _resolve, compare, fastest_trl, override, startup_milestones, trl_config


def _row(config: str, curve: list[tuple[float, float]], seconds_per_step: float = 10.0) -> dict[str, Any]:
    """A finished row whose held-out accuracy is `curve`: (clock seconds, accuracy) at steps 0, 4, 8, ..."""
    evals = [{"step": 4 * i, "clock_seconds": t, "accuracy": a} for i, (t, a) in enumerate(curve)]
    return {
        "config": config,
        "evals": evals,
        "rewards": [],
        "seconds_per_step": seconds_per_step,
        "seconds_per_step_mean": seconds_per_step,
        "peak_rss_mb": 10_000.0,
    }


def test_the_fastest_is_the_soonest_at_090_and_failed_rows_never_count() -> None:
    slow = _row("fp32", [(0, 0.2), (300, 0.8), (600, 0.92)])
    quick = _row("bf16", [(0, 0.2), (200, 0.91), (400, 0.95)])
    broken = {"config": "vllm-colocate", "failed": "AttributeError: ...", "peak_rss_mb": 4000.0}
    assert fastest_trl([slow, broken, quick]) is quick


def test_a_row_that_reaches_090_beats_one_that_ends_lower_sooner() -> None:
    reaches = _row("fp32", [(0, 0.2), (900, 0.9)])
    stops_short = _row("bf16", [(0, 0.2), (100, 0.6)])
    assert fastest_trl([stops_short, reaches]) is reaches


def test_without_090_the_soonest_at_its_own_final_accuracy_wins() -> None:
    late = _row("fp32", [(0, 0.2), (300, 0.7), (600, 0.7)])  # first at 0.7 at 300 s
    early = _row("bf16", [(0, 0.2), (250, 0.6)])
    assert fastest_trl([late, early]) is early


def test_the_goal_checks_speed_to_090_and_half_the_memory() -> None:
    trl = _row("bf16", [(0, 0.2), (500, 0.9)], seconds_per_step=20.0)
    ours = {**_row("ours", [(0, 0.2), (90, 0.9)], seconds_per_step=4.0), "peak_rss_mb": 4_000.0}
    for e in ours["evals"]:
        e["raw_seconds"] = e["clock_seconds"]
    result = compare(ours, trl)
    assert result["time_to_accuracy_seconds"]["0.90"]["speedup"] == pytest.approx(500 / 90)
    assert result["goal_speedup_met"] is True
    assert result["peak_rss_ratio_ours_over_trl"] == pytest.approx(0.4)
    assert result["goal_peak_rss_met"] is True
    assert result["seconds_per_step_ratio_trl_over_ours"] == pytest.approx(5.0)


def test_fastest_plus_generation_batching_lands_on_the_fastest_base_that_ran() -> None:
    done: list[dict[str, Any]] = [
        {"config": "fp32", "seconds_per_step": 40.0},
        {"config": "bf16", "seconds_per_step": 25.0},
        {"config": "vllm-colocate", "failed": "..."},
    ]
    assert _resolve("fastest+gen2", done) == "bf16+gen2"
    assert trl_config("bf16+gen2").grpo_options() == {"bf16": True, "use_vllm": False, "steps_per_generation": 2}


def test_minibatches_split_each_batch_into_optimizer_steps_over_one_generation() -> None:
    done: list[dict[str, Any]] = [{"config": "bf16", "seconds_per_step": 25.0}]
    assert _resolve("fastest+mb2", done) == "bf16+mb2"
    config = trl_config("bf16+mb2")
    # one generation of the step's 64 completions feeds both optimizer steps of 32
    assert config.minibatches == 2 and config.steps_per_generation == 1
    assert config.grpo_options() == {"bf16": True, "use_vllm": False, "steps_per_generation": 2}


@pytest.mark.parametrize("spec", ["bf16+mb0", "bf16+mb", "bf16+gen", "bf16+foo2"])
def test_a_malformed_suffix_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match=r"\+genN or \+mbN"):
        trl_config(spec)


def test_fastest_with_nothing_run_before_it_is_an_error() -> None:
    with pytest.raises(ValueError, match="no configuration before it ran"):
        _resolve("fastest+gen2", [{"config": "vllm-colocate", "failed": "..."}])


def test_an_unknown_configuration_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="one of fp32, bf16, vllm-colocate, fastest"):
        _resolve("bf17", [])


def test_startup_milestones_read_the_services_logs_and_the_summary(tmp_path: Path) -> None:
    launched = 1_800_000_000.0  # 2027-01-15T08:00:00Z

    def line(event: str, second: int) -> str:
        return json.dumps({"event": event, "timestamp": f"2027-01-15T08:00:{second:02d}.000000Z"})

    (tmp_path / "gateway.log").write_text(line("service.serving", 2) + "\ntrinity gateway serving\n")
    (tmp_path / "trainer.log").write_text(
        "\n".join([line("service.serving", 6), "a plain line", line("weights.group_ready", 15)])
    )
    summary = {"explore": [{"unix_ms": (launched + 21) * 1000}], "train": []}
    got = startup_milestones(tmp_path, summary, launched)
    assert got["gateway_serving"] == 2.0 and got["trainer_serving"] == 6.0
    assert got["sync_group_ready"] == 15.0 and got["first_batch_put"] == 21.0
    assert got["buffer_serving"] is None and got["first_step_trained"] is None  # no log, no step: unknown


def test_ours_set_changes_one_setting_of_the_quickstart_config() -> None:
    config = {"explorer": {"threads": 0, "engine_options": {"dtype": "bfloat16"}}}
    override(config, "explorer.threads=2")
    override(config, "explorer.engine_options.dtype=float32")
    override(config, "trainer.micro_batch_tokens=1536")
    assert config == {
        "explorer": {"threads": 2, "engine_options": {"dtype": "float32"}},
        "trainer": {"micro_batch_tokens": 1536},
    }


def test_ours_set_refuses_an_assignment_without_a_value() -> None:
    with pytest.raises(ValueError, match=r"explorer\.threads=2"):
        override({}, "explorer.threads")
