"""The `reasoning_gym` reward on tasks a real Buffer generated: the generator's own scoring, sample for sample."""

from __future__ import annotations

import uuid

import pytest
from explorer_helpers import make_task

from trinity.clients import BufferClient
from trinity.config import TaskSetConfig
from trinity.explorer.rewards import evaluate_reward, get_reward

# Generators whose scoring reads their config (decimal_arithmetic, time_intervals), their metadata (number_sorting,
# word_sorting, time_intervals) or tuples in it (rearc), beside plain ones.
GENERATORS = [
    {"name": "rearc"},
    {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 3}},
    {"name": "leg_counting"},
    {"name": "decimal_arithmetic", "config": {"min_num_decimal_places": 1, "max_num_decimal_places": 2}},
    {"name": "time_intervals", "config": {"max_time_difference_seconds": 3600}},
    {"name": "number_sorting"},
    {"name": "word_sorting"},
    {"name": "fraction_simplification"},
]
SIZE, SEED = 50, 7


def responses(answer: str, other_answer: str, k: int) -> list[str]:
    """Four responses to one task: right, wrong, malformed (one of four kinds), right with words after it."""
    malformed = [
        f"The answer is {answer}",  # no tags
        f"<answer>{answer}",  # never closed
        "<answer></answer>",
        "<answer>[[ not an answer</answer>",
    ][k % 4]
    return [
        f"<think>step by step</think>\n<answer>{answer}</answer>",
        f"<answer>{other_answer}</answer>",
        malformed,
        f"<answer>{answer} (final)</answer>",
    ]


@pytest.fixture(scope="module")
def generated_tasks(buffer_service):
    name = f"rg-reward-{uuid.uuid4().hex[:8]}"
    config = TaskSetConfig.model_validate(
        {
            "name": name,
            "source": "reasoning_gym",
            "reasoning_gym": {"size": SIZE, "seed": SEED, "generators": GENERATORS},
        }
    )
    with BufferClient(buffer_service.address) as client:
        client.create_taskset(config, replace=True)
        tasks = list(client.lease_tasks(name, "explorer-1", SIZE).tasks)
    assert len(tasks) == SIZE
    return tasks


def test_rewards_equal_the_generators_own_scoring_on_200_samples(generated_tasks):
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec
    from reasoning_gym.utils import extract_answer

    specs = [DatasetSpec(name=g["name"], weight=g.get("weight", 1.0), config=g.get("config", {})) for g in GENERATORS]
    composite = CompositeDataset(CompositeConfig(size=SIZE, seed=SEED, datasets=specs))  # reasoning-gym alone
    reward = get_reward("reasoning_gym")
    compared, right = 0, []
    for k, task in enumerate(generated_tasks):
        entry = composite[task.index]
        assert task.prompt == entry["question"]
        other = generated_tasks[(k + 1) % SIZE].answer
        for i, text in enumerate(responses(entry["answer"], other, k)):
            outcome = evaluate_reward(reward, text, task)
            assert not outcome.failed, outcome.error
            try:
                own = composite.score_answer(extract_answer(text), entry)
            except Exception:  # noqa: BLE001 - the reward counts an answer the generator cannot read as 0
                own = 0.0
            assert outcome.reward == own, (task.payload["reasoning_gym"]["generator"], text)
            compared += 1
            if i == 0:
                right.append(outcome.reward)
    assert compared == 200
    assert right == [1.0] * SIZE  # every generator gives its own answer full marks


def test_the_answer_is_the_last_answer_tag_else_the_last_boxed(generated_tasks):
    task = generated_tasks[0]
    reward = get_reward("reasoning_gym")
    assert evaluate_reward(reward, f"<answer>x</answer> then <answer>{task.answer}</answer>", task).reward == 1.0
    assert evaluate_reward(reward, f"so \\boxed{{{task.answer}}}", task).reward == 1.0
    assert evaluate_reward(reward, "no answer given", task).reward == 0.0


def test_a_task_without_a_generator_fails_with_the_fix():
    outcome = evaluate_reward(get_reward("reasoning_gym"), "<answer>4</answer>", make_task(answer="4"))
    assert outcome.failed and "no payload.reasoning_gym" in outcome.error and "source reasoning_gym" in outcome.error


def test_a_task_whose_entry_comes_out_differently_here_fails_instead_of_scoring_another_entry(generated_tasks):
    task = type(generated_tasks[0])()
    task.CopyFrom(generated_tasks[0])
    task.payload["question"] = "a question this generator did not make"
    outcome = evaluate_reward(get_reward("reasoning_gym"), f"<answer>{task.answer}</answer>", task)
    assert outcome.failed and "same reasoning-gym version" in outcome.error
