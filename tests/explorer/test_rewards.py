"""Reward functions: answers, formats, countdown equations, composites, failures and timeouts."""

from __future__ import annotations

import threading

import pytest
from explorer_helpers import make_task

from trinity.explorer.rewards import REWARDS, evaluate_reward, get_reward
from trinity.explorer.rewards.countdown import UnsafeExpression, evaluate_expression
from trinity.explorer.rewards.math import extract_boxed, extract_last_number


def reward(name, text, task):
    outcome = evaluate_reward(get_reward(name), text, task)
    assert not outcome.failed, outcome.error
    return outcome.reward


def test_builtin_rewards_are_registered():
    assert {"math", "accuracy", "format", "countdown", "math_format"} <= set(REWARDS.names())


def test_extractors_take_the_last_boxed_and_last_number():
    assert extract_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_last_number("I had 3 apples, now 1,250.5 of them") == "1250.5"
    assert extract_last_number("no digits") is None


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [
        (r"So the answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        (r"\boxed{0.5}", "1/2", 1.0),
        ("3 + 4 = 7", "7", 1.0),
        (r"\boxed{8}", "7", 0.0),
        ("I do not know", "7", 0.0),
    ],
)
def test_math_reward_checks_equivalence(text, answer, expected):
    assert reward("math", text, make_task(answer=answer)) == expected


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [("The answer is 42", "42", 1.0), ("42.0", "42", 1.0), ("41 or 42? 41", "42", 0.0), ("none", "42", 0.0)],
)
def test_accuracy_reward_uses_the_last_number(text, answer, expected):
    assert reward("accuracy", text, make_task(answer=answer)) == expected


def test_format_reward_defaults_to_think_answer_tags():
    task = make_task()
    assert reward("format", "<think>hm</think> <answer>4</answer>", task) == 1.0
    assert reward("format", "<answer>4</answer>", task) == 0.0
    assert reward("format", "<think>hm</think><answer>4</answer> trailing", task) == 0.0


def test_format_reward_uses_the_task_pattern():
    task = make_task(format_pattern=r"ANSWER: \d+")
    assert reward("format", "ANSWER: 12", task) == 1.0
    assert reward("format", "answer 12", task) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>(6 - 2) * 3</answer>", 1.0),  # each number once, = 12
        ("<think>easy</think><answer>3 * (6 - 2) = 12</answer>", 1.0),
        ("I get 3*(6-2)", 1.0),  # no tags: the last arithmetic run
        ("<answer>6 + 2 + 3</answer>", 0.1),  # well formed, wrong value
        ("<answer>6 * 2</answer>", 0.1),  # right value, 3 unused
        ("<answer>(6 - 2) * 3 * 1</answer>", 0.1),  # 1 is not given
        ("<answer>6 / (2 - 2) * 3</answer>", 0.0),  # division by zero
        ("<answer>__import__('os').system('true')</answer>", 0.0),
        ("no equation", 0.0),
    ],
)
def test_countdown_reward(text, expected):
    task = make_task(numbers=[6, 2, 3], target=12)
    assert reward("countdown", text, task) == expected


@pytest.mark.parametrize("expression", ["2 ** 100000", "abs(-3)", "x + 1", "[1][0]", "1 if 1 else 2", "1.5 + 1"])
def test_countdown_evaluator_rejects_anything_but_integer_arithmetic(expression):
    with pytest.raises(UnsafeExpression):
        evaluate_expression(expression)


def test_countdown_evaluator_is_exact():
    value, used = evaluate_expression("(1 + 2) / 3 * 7")
    assert value == 7
    assert used == [1, 2, 3, 7]


def test_composite_reward_weights_its_parts():
    task = make_task(answer="4")
    outcome = evaluate_reward(get_reward("composite:math=0.8,format=0.2"), r"\boxed{4}", task)
    assert outcome.components == {"math": 1.0, "format": 0.0, "reward": pytest.approx(0.8)}
    assert outcome.reward == pytest.approx(0.8)
    full = evaluate_reward(get_reward("math_format"), r"<think>x</think><answer>\boxed{4}</answer>", task)
    assert full.reward == pytest.approx(1.0)


def test_a_raising_reward_gives_a_failed_outcome():
    def broken(text, task):
        raise RuntimeError("bad parser")

    outcome = evaluate_reward(broken, "x", make_task())
    assert outcome.failed
    assert outcome.error == "RuntimeError: bad parser"


def test_a_reward_past_its_timeout_gives_a_failed_outcome():
    release = threading.Event()

    def stuck(text, task):
        release.wait()  # never set until after the check: cannot finish in time
        return 1.0

    try:
        outcome = evaluate_reward(stuck, "x", make_task(), timeout_s=0.05)
    finally:
        release.set()
    assert outcome.failed
    assert "timed out" in outcome.error


def test_a_reward_of_the_wrong_type_gives_a_failed_outcome():
    outcome = evaluate_reward(lambda text, task: "1.0", "x", make_task())
    assert outcome.failed
    assert "expected float or dict" in outcome.error


def test_unknown_reward_names_list_the_registered_ones():
    with pytest.raises(KeyError, match="known: accuracy"):
        get_reward("nope")
