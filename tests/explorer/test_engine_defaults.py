"""The engine's device-aware defaults: bf16 and CUDA graphs on a GPU, the CPU's settings unchanged, explicit options
winning everywhere, and the resolved values logged at start. The device kind is injected: no GPU is needed."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from trinity.config import RunConfig, parse_run_config
from trinity.explorer.runner import build_engine, engine_settings, on_gpu

BENCH = "mode: bench\nmodel: {path: m}\nbuffer: {eval_tasksets: [{path: eval.jsonl}]}\n"


def _config(explorer: str = "{}", model: str = "{path: m}") -> RunConfig:
    return parse_run_config(BENCH.replace("{path: m}", model) + f"explorer: {explorer}")


def test_a_gpu_samples_in_bf16_with_cuda_graphs_by_default() -> None:
    settings = engine_settings(_config(), "m", gpu=True)
    assert (settings["dtype"], settings["enforce_eager"]) == ("bfloat16", False)


def test_a_cpu_keeps_the_model_dtype_and_eager_mode_by_default() -> None:
    settings = engine_settings(_config(model="{path: m, dtype: float16}"), "m", gpu=False)
    assert (settings["dtype"], settings["enforce_eager"]) == ("float16", True)


def test_options_set_in_the_config_win_on_a_gpu() -> None:
    config = _config("{engine_options: {dtype: float32, enforce_eager: true}}")
    settings = engine_settings(config, "m", gpu=True)
    assert (settings["dtype"], settings["enforce_eager"]) == ("float32", True)


def test_the_trainer_still_publishes_in_the_model_dtype_when_a_gpu_engine_picks_bf16() -> None:
    # The engine casts each update on load; only an explicit engine dtype changes what is sent.
    assert _config().engine_dtype == "float32"
    assert _config("{engine_options: {dtype: bfloat16}}").engine_dtype == "bfloat16"


def test_the_transformers_engine_is_on_a_gpu_where_its_device_says_and_gets_no_vllm_option() -> None:
    cuda = _config("{engine: transformers, engine_options: {device: 'cuda:1'}}")
    assert on_gpu(cuda)
    settings = engine_settings(cuda, "m", gpu=True)
    assert settings["dtype"] == "bfloat16" and "enforce_eager" not in settings
    assert not on_gpu(_config("{engine: transformers}"))


def test_the_engine_logs_the_values_it_resolved(tiny_model: Path) -> None:
    with capture_logs() as logs:
        build_engine(_config("{engine: transformers}"), str(tiny_model))
    (event,) = [e for e in logs if e["event"] == "explorer.engine"]
    assert {k: event[k] for k in ("engine", "device", "dtype", "enforce_eager")} == {
        "engine": "transformers",
        "device": "cpu",
        "dtype": "float32",
        "enforce_eager": None,
    }
