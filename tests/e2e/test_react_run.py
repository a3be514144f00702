"""`trinity run` end to end with the `react` workflow: arithmetic questions, the calculator offered, vLLM on the
tiny model (whose random weights rarely write a call: this proves the run's plumbing; tests/explorer/test_react.py
proves the calls)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import EXAMPLES, tiny_config
from tests.e2e.test_run import succeeded_summary


@pytest.mark.system  # a whole stack and a vLLM engine: 25 s here
def test_a_react_run_on_the_tiny_model_succeeds(long_context_tiny_model, tmp_path):
    # The first prompt, tool list and all, is 506 byte tokens: the 512 positions of `tiny_model` would not hold a
    # turn more.
    model = long_context_tiny_model
    config = tiny_config(
        model,
        **{
            "model.max_prompt_tokens": 1024,
            "buffer.total_steps": 2,
            "buffer.eval_tasksets": [],
            "buffer.taskset": {
                "path": str(EXAMPLES / "train.jsonl"),
                "prompt_key": "question",
                "answer_key": "answer",
                "reward_fn": "accuracy",
            },
            "explorer.workflow": "react",
            "explorer.workflow_options": {"tools": ["calculator"], "max_turns": 2, "tool_timeout_s": 2.0},
            "explorer.eval_interval": 0,
        },
    )
    summary = succeeded_summary(config, tmp_path)
    assert len(summary["train"]) == 2
    assert sum(row.get("dropped_rollouts", 0.0) for row in summary["explore"]) == 0
    counts = summary["experience_counts"]["stage0"]
    assert counts["pending"] == 0 and counts["acked"] == 2 * 2 * 4  # 2 train batches of batch_size x repeats
