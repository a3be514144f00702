"""`trinity run` end to end (every service a process, vLLM on a tiny model) with a task the workflow cannot run:
its rollouts are dropped and counted, and the run trains every step and succeeds."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import tiny_config
from tests.e2e.test_run import succeeded_summary

# guess_number reads the secret with int(): "seven" makes every rollout of that task raise ValueError.
ROWS = [{"question": "Guess my number between 1 and 9.", "answer": answer} for answer in ("3", "seven", "5", "8")]


@pytest.mark.system  # a whole stack and a vLLM engine: half a minute to a minute and a half on 2 shared cores
def test_a_run_with_a_task_that_cannot_be_rolled_out_succeeds_and_counts_the_drops(tiny_model, tmp_path):
    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = tiny_config(
        tiny_model,
        **{
            "model.max_prompt_tokens": 256,  # the chat grows by a turn each round
            "buffer.total_steps": 2,
            "buffer.taskset": {"path": str(data), "prompt_key": "question", "answer_key": "answer", "epochs": 8},
            "buffer.eval_tasksets": [],
            "explorer.workflow": "multi_turn",
            "explorer.workflow_options": {"max_turns": 2},
            "explorer.rollout_retries": 1,
            "explorer.eval_interval": 0,
        },
    )
    summary = succeeded_summary(config, tmp_path)
    assert len(summary["train"]) == 2
    explore = summary["explore"]
    dropped = sum(row.get("dropped_rollouts.error:ValueError", 0.0) for row in explore)
    assert dropped >= 1 and dropped == sum(row["dropped_rollouts"] for row in explore)
    assert sum(row["rollout_retries"] for row in explore) == dropped  # one retry each, then dropped
    counts = summary["experience_counts"]["stage0"]
    assert counts["pending"] == 0 and counts["acked"] == 2 * 2 * 4  # 2 train batches of batch_size x repeats
