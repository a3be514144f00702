"""The arithmetic of bench_compile's and bench_memory_floor's summaries (their measurements need the real model)."""

from __future__ import annotations

import pytest

from benchmarks import bench_compile, bench_memory_floor


def _mode(first: float, steps: list[float], grad_norm: float = 1.0) -> dict:
    median = sorted(steps)[len(steps) // 2]
    return {
        "first_step_seconds": first,
        "step_seconds_all": steps,
        "step_seconds_median": median,
        "first_step_metrics": {"grad_norm": grad_norm},
    }


def _summary(eager: tuple, cold: tuple, warm: tuple) -> dict:
    """bench_compile's summary of three modes, each (first step seconds, the seconds of the steps after it)."""
    modes = {"eager": _mode(*eager), "compiled_cold": _mode(*cold), "compiled_warm": _mode(*warm)}
    return bench_compile.summary(modes)


def test_compiling_pays_after_its_overhead_over_the_seconds_it_saves_per_step():
    out = _summary((8.0, [6.0, 6.0, 6.0]), (125.0, [5.0, 5.0, 5.0]), (34.0, [4.0, 4.0, 4.0]))
    assert out["compiled_cold"]["speedup"] == pytest.approx(1.2)
    assert out["compiled_cold"]["compile_overhead_seconds"] == pytest.approx(120.0 - 2.0)  # beyond eager's warm-up
    assert out["compiled_cold"]["steps_to_break_even"] == pytest.approx(118.0)
    assert out["compiled_warm"]["steps_to_break_even"] == pytest.approx(14.0)


def test_a_recompilation_at_a_later_step_counts_in_the_overhead():
    # the cold mode compiles a second graph at step 2
    out = _summary((6.0, [6.0, 6.0, 6.0]), (105.0, [105.0, 5.0, 5.0, 5.0]), (5.0, [5.0, 5.0, 5.0]))
    assert out["compiled_cold"]["compile_overhead_seconds"] == pytest.approx(200.0)
    assert out["compiled_warm"]["compile_overhead_seconds"] == pytest.approx(0.0)


def test_a_compiled_step_no_faster_than_eager_never_breaks_even():
    out = _summary((8.0, [6.0, 6.0, 6.0]), (60.0, [6.5, 6.5, 6.5]), (20.0, [6.0, 6.0, 6.0]))
    assert out["compiled_cold"]["steps_to_break_even"] is None
    assert out["compiled_warm"]["steps_to_break_even"] is None


def test_a_compiled_mode_that_trains_differently_is_refused():
    same = _summary((8.0, [6.0]), (60.0, [5.0]), (20.0, [5.0]))
    bench_compile.check_same_training(same)  # equal metrics pass
    off = _summary((8.0, [6.0], 1.0), (60.0, [5.0], 1.2), (20.0, [5.0], 1.0))
    with pytest.raises(AssertionError, match="compiled_cold trains differently"):
        bench_compile.check_same_training(off)


def test_a_compiled_mode_with_no_metric_to_compare_is_refused():
    modes = {name: _mode(8.0, [6.0]) for name in bench_compile.MODES}
    modes["compiled_warm"]["first_step_metrics"] = {}
    with pytest.raises(AssertionError, match="compiled_warm trains differently"):
        bench_compile.check_same_training(bench_compile.summary(modes))


def test_metric_differences_are_relative_and_only_over_metrics_both_report():
    eager = {"grad_norm": 2.0, "entropy": 0.5, "tokens": 10.0}
    other = {"grad_norm": 2.2, "tokens": 99.0}
    assert bench_compile.metric_differences(eager, other) == pytest.approx({"grad_norm": 0.1})


PARTS = {
    "trainer": {"imports": 400.0, "+ AdamW moments": 1700.0, "parameters": 2.0**27},  # 2048 MB of state
    "explorer": {"engine built": 1500.0},
}


def _e2e() -> dict:
    return {
        "when": "2026-12-03T08:36:00Z",
        "ours": {
            "peak_rss_mb": 6000.0,
            "memory": {
                "at_peak_mb": {
                    "trinity.runtime.serve trainer": 4000.0,
                    "trinity.runtime.serve explorer": 1800.0,
                    "trinity.runtime.serve buffer": 80.0,
                    "redis-server": 20.0,
                }
            },
        },
        "comparison": {"trl_configuration": "bf16+mb2"},
        "table": [{"config": "ours", "peak_rss_mb": 6000.0}, {"config": "bf16+mb2", "peak_rss_mb": 6600.0}],
    }


def test_the_floor_adds_the_rest_of_the_stack_and_is_measured_against_half_the_fastest_trl():
    out = bench_memory_floor.floor(PARTS, _e2e())
    assert out["trainer_mb"] == pytest.approx(400.0 + 2048.0)  # imports + 16 bytes per parameter
    assert out["rest_of_stack_mb"] == pytest.approx(100.0)  # every role but the two services
    assert out["floor_mb"] == pytest.approx(2448.0 + 1500.0 + 100.0)
    assert out["goal_mb"] == pytest.approx(3300.0)
    assert out["floor_over_goal"] == pytest.approx(4048.0 / 3300.0)


def test_without_an_e2e_run_the_floor_is_the_two_parts_only():
    assert bench_memory_floor.floor(PARTS, None) == pytest.approx({"trainer_mb": 2448.0, "explorer_mb": 1500.0})
