"""Run configs that let each online algorithm preset run as it is meant to, on a tiny random model.

A random byte-level model almost never answers arithmetic, so every group would score the same and most
presets would see zero advantages (DAPO's filter would drop every group). The tasks written here are scored
by the `format` reward against a pattern that random bytes match about half the time: groups get mixed
rewards, so advantages, filters and the weights' update are all exercised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.conftest import EXAMPLES, tiny_config
from trinity.algorithm_table import PRESETS, WORKFLOW_INPUTS

# A response scores 1 when one of its characters is a digit or an ASCII lower-case letter: roughly half
# of the 8-token responses of the tiny model (measured in tests/e2e/test_every_preset.py's reward check).
MIXED_REWARD_PATTERN = r"(?s).*[0-9a-z].*"
# Presets whose inputs only multi-step workflows write run on the FrozenLake workflow.
MULTI_STEP_PRESETS = frozenset(
    name
    for name, p in PRESETS.items()
    if p.requires - WORKFLOW_INPUTS["math"] and p.requires <= WORKFLOW_INPUTS["frozen_lake"]
)
# The SFT example's chats: the expert demonstrations of presets that mix them into RL batches (mode `both`).
EXPERT_DATA = EXAMPLES.parent / "sft" / "train.jsonl"


def online_presets() -> list[str]:
    """The built-in presets that explore (data kind `rollout`); offline ones (SFT, DPO) are run elsewhere."""
    return sorted(name for name, preset in PRESETS.items() if preset.online)


def write_mixed_reward_tasks(path: Path, rows: int = 8) -> Path:
    lines = [
        {"question": f"Say anything ({i}).", "answer": "", "format_pattern": MIXED_REWARD_PATTERN} for i in range(rows)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def preset_run_config(
    name: str, model: Path, tasks: Path, checkpoint_dir: Path, *, teacher: Path | None = None, steps: int = 2
) -> dict[str, Any]:
    """Two small synchronous steps of preset `name`: 2 tasks x 4 samples, no evaluation."""
    config = tiny_config(
        model,
        **{
            "name": f"preset-{name.replace('_', '-')}",
            "checkpoint_dir": str(checkpoint_dir),
            "algorithm": {"algorithm_type": name, "repeat_times": 4},
            "buffer.total_steps": steps,
            "buffer.eval_tasksets": [],
            "buffer.taskset": {
                "path": str(tasks),
                "prompt_key": "question",
                "answer_key": "answer",
                "reward_fn": "format",
                "epochs": 100,
            },
        },
    )
    if name in MULTI_STEP_PRESETS:
        config["buffer"]["taskset"] = {
            "path": str(EXAMPLES.parent / "frozenlake" / "train.jsonl"),
            "prompt_key": "prompt",
            "answer_key": "prompt",
        }
        config["explorer"].update(workflow="frozen_lake", workflow_options={"max_steps": 2})
        config["model"]["max_prompt_tokens"] = 384  # the board and the rules, as examples/frozenlake sets it
    preset = PRESETS[name]
    if preset.uses_expert_data:
        config["buffer"]["offline_data"] = {"path": str(EXPERT_DATA), "messages_key": "messages"}
    if preset.needs_teacher:
        if teacher is None:
            raise ValueError(f"preset {name!r} needs a teacher model; pass teacher=")
        config["algorithm"]["teacher_model"] = str(teacher)
    return config
