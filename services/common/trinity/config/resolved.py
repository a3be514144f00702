"""A run as it will run: every stage validated and merged, every default filled in, and what its preset applies.

`trinity check` prints it; `trinity run`, `trinity submit` and the console's configure page run the same check
(`resolved_run`) before anything starts, so a config each of them accepts is the one this shows.
"""

from __future__ import annotations

from typing import Any

from trinity.algorithm_table import ROW_INPUT_SOURCES
from trinity.config.algorithm import resolve_algorithm
from trinity.config.preset_operators import applied_by_preset, stream_operators
from trinity.config.run import RunConfig


def resolved_run(config: RunConfig) -> list[dict[str, Any]]:
    """Each stage's config with every default, and the algorithm it resolves to; ConfigError naming the field of
    the first stage that does not validate."""
    return [_resolved_stage(stage) for stage in config.stage_configs()]


def _resolved_stage(stage: RunConfig) -> dict[str, Any]:
    algorithm = resolve_algorithm(stage.algorithm)
    preset = algorithm.preset
    added = {op.name for op in applied_by_preset(stage)}
    return {
        "config": stage.model_dump(mode="json", exclude={"stages"}),
        "algorithm": {
            "preset": preset.name,
            "description": preset.description,
            "data": preset.data_kind,
            "functions": {kind: {"name": name, **args} for kind, (name, args) in algorithm.functions.items()},
            "kl_loss": {"estimator": algorithm.kl_loss, "coef": algorithm.kl_coef} if algorithm.kl_loss else None,
            "kl_penalty": (
                {"estimator": algorithm.kl_penalty, "coef": algorithm.kl_penalty_coef} if algorithm.kl_penalty else None
            ),
            "reference_model": algorithm.needs_reference,
            "critic": preset.needs_critic,
            "teacher_model": stage.algorithm.teacher_model or None,
            "group_size": algorithm.group_size,
            "train_batch_size": stage.train_batch_size,
            "row_inputs": {r.value: ROW_INPUT_SOURCES[r] for r in sorted(preset.requires)},
            "stream_operators": [
                {"name": op.name, "params": dict(op.params), "by": "preset" if op.name in added else "config"}
                for op in stream_operators(stage)
            ],
        },
    }
