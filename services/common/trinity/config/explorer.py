"""The explorer section of the run config: engine, workflow, sampling, evaluation, serve and bench modes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from trinity.config.base import _Section


class ExplorerConfig(_Section):
    engine: Literal["vllm", "transformers"] = "vllm"
    engine_options: dict[str, Any] = Field(default_factory=dict)
    workflow: str = "math"
    workflow_options: dict[str, Any] = Field(default_factory=dict)
    num_workers: int = Field(default=1, ge=1, description="explorer processes in the run")
    threads: int = Field(
        default=0,
        ge=0,
        description="`trinity run`: torch threads per explorer process; 0 = the cores split among explorers",
    )
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1
    stop: tuple[str, ...] = ()
    reward_timeout_seconds: float = Field(default=10.0, gt=0)
    eval_interval: int = Field(default=0, ge=0, description="evaluate every N weight versions; 0 = never")
    eval_on_start: bool = True
    eval_temperature: float = Field(default=1.0, ge=0)
    eval_repeat_times: int = Field(default=1, ge=1)
    # serve mode (trinity.explorer.openai_api): the OpenAI-compatible HTTP endpoint agents call
    openai_host: str = Field(default="127.0.0.1", description="bind address; 0.0.0.0 to serve other hosts")
    openai_port: int = Field(default=0, ge=0, le=65535, description="0 = pick a free port (reported in events)")
    session_ttl_seconds: float = Field(default=3600.0, gt=0, description="sessions without feedback expire")
    # bench mode (trinity.explorer.bench): where the JSON report goes; "" = <checkpoint_dir or cwd>/bench_report.json
    bench_output: str = ""
