"""Mode `bench`: evaluate a model directory or checkpoint on task sets and write a JSON report.

Every task of each eval task set (or of each train task set when there are none) is evaluated once by
`trinity.explorer.evaluation`; the report holds the metrics per task set and overall, and the
`finished` event names its path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trinity.config import RunConfig
from trinity.explorer.context import ExplorerContext
from trinity.explorer.evaluation import evaluate
from trinity.v1 import gateway_pb2


def report_path(config: RunConfig) -> Path:
    if config.explorer.bench_output:
        return Path(config.explorer.bench_output)
    return Path(config.checkpoint_dir or ".") / "bench_report.json"


def run(ctx: ExplorerContext) -> str:
    """Evaluate, report an `eval` event, write the JSON report; returns the finish message naming it."""
    cfg = ctx.config
    sections = cfg.buffer.eval_tasksets or cfg.buffer.train_tasksets
    evaluation = evaluate(ctx, sections)
    report: dict[str, Any] = {
        "run_id": ctx.run_id,
        "model_path": cfg.model.path,
        "model_version": ctx.model_version,
        "engine": cfg.explorer.engine,
        "workflow": cfg.explorer.workflow,
        "temperature": cfg.explorer.eval_temperature,
        "repeat_times": cfg.explorer.eval_repeat_times,
        "max_response_tokens": cfg.model.max_response_tokens,
        "seconds": evaluation.seconds,
        "created_unix": int(time.time()),
        "overall": evaluation.overall,
        "tasksets": evaluation.tasksets,
    }
    path = report_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    ctx.report(
        gateway_pb2.EVENT_KIND_EVAL,
        metrics=evaluation.metrics(),
        message=f"bench at version {ctx.model_version}: {path}",
    )
    return f"bench report: {path.resolve()}"
