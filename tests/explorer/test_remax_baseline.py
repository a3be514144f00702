"""ReMax: the explorer adds a greedy sample per task and puts its reward on every row of the group."""

from __future__ import annotations

from typing import Any

import pytest
from explorer_helpers import make_task

from trinity.config import RunConfig
from trinity.config.algorithm import PRESETS
from trinity.explorer.engines import SamplingSettings
from trinity.explorer.engines.base import GenerationRequest, Sample
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.rollout import needs_greedy_baseline
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.registry_names import KINDS


class GreedyKnows(ScriptedEngine):
    """Right when greedy, wrong when sampling; counts engine calls."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, lambda prompt: "")
        self.calls = 0

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        self.calls += 1
        return super()._generate(prompts, requests)

    def _reply(self, prompt_text: str, request: GenerationRequest) -> Sample:
        self._reply_fn = lambda prompt: r"\boxed{7}" if request.sampling.temperature == 0 else r"\boxed{5}"
        return super()._reply(prompt_text, request)


def test_every_row_carries_the_greedy_responses_reward(tokenizer: Any) -> None:
    tasks = [make_task(prompt="What is 3+4?", answer="7", task_id=f"set/{i}") for i in range(2)]
    engine = GreedyKnows(tokenizer)
    settings = RolloutSettings(
        repeat_times=3, sampling=SamplingSettings(temperature=1.0, max_tokens=8), greedy_baseline=True
    )
    groups = create_workflow("math").run_batch(tasks, engine, settings)
    assert engine.calls == 1  # sampled and greedy requests share one call (one weight version)
    assert [len(g) for g in groups] == [3, 3]  # the greedy sample is a baseline, not a training row
    for exp in (e for g in groups for e in g):
        assert exp.reward == 0.0
        assert exp.reward_components["reward_baseline"] == 1.0
        assert exp.metrics["baseline_failed"] == 0.0


def test_without_the_setting_no_baseline_is_sampled(tokenizer: Any) -> None:
    engine = GreedyKnows(tokenizer)
    (group,) = create_workflow("math").run_batch([make_task(prompt="3+4?", answer="7")], engine, RolloutSettings())
    assert "reward_baseline" not in group[0].reward_components


def test_the_baseline_algorithms_are_the_presets_that_need_reward_baselines() -> None:
    needing = {name for name in KINDS["algorithm"].builtins if PRESETS.get(name).greedy_baseline}
    assert needing == {"remax"}


def _config(algorithm: str, workflow: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"path": "unused"},
            "algorithm": {"algorithm_type": algorithm},
            "buffer": {"taskset": {"path": "unused.jsonl"}},
            "explorer": {"workflow": workflow},
        }
    )


def test_a_workflow_that_cannot_add_the_greedy_sample_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'remax' needs per-row reward_baselines .* workflow 'multi_turn'"):
        _config("remax", "multi_turn")  # a built-in workflow: refused when the config is parsed
    # A plugin's workflow is not in the algorithm table: the explorer asks the workflow object itself.
    with pytest.raises(ValueError, match=r"'remax' needs a greedy baseline"):
        needs_greedy_baseline(_config("remax", "math"), create_workflow("multi_turn"))
    assert needs_greedy_baseline(_config("remax", "math"), create_workflow("math"))
    assert not needs_greedy_baseline(_config("grpo", "math"), create_workflow("math"))
