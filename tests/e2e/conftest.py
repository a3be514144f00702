"""A tiny real model and a config writer for end-to-end runs through all four services."""

from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def tiny_config(model: Path, **overrides) -> dict:
    config = {
        "name": "tiny",
        "mode": "both",
        "model": {"path": str(model), "max_prompt_tokens": 64, "max_response_tokens": 8},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "kl_coef": 0.0},
        "buffer": {
            "batch_size": 2,
            "total_steps": 3,
            "taskset": {
                "path": str(EXAMPLES / "train.jsonl"),
                "prompt_key": "question",
                "answer_key": "answer",
                "reward_fn": "accuracy",
            },
            "eval_tasksets": [
                {
                    "name": "heldout",
                    "path": str(EXAMPLES / "eval.jsonl"),
                    "prompt_key": "question",
                    "answer_key": "answer",
                    "reward_fn": "accuracy",
                    "limit": 4,
                }
            ],
        },
        "explorer": {"engine": "vllm", "workflow": "math", "eval_interval": 2},
        "trainer": {"optimizer": {"lr": 1.0e-3}},
        "synchronizer": {"method": "gloo", "timeout_seconds": 60},
        "monitor": {"tensorboard": True},
    }
    for dotted, value in overrides.items():
        node = config
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path
