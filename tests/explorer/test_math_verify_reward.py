r"""The `math_verify` reward: GSM8K (`#### 42`) and MATH (`\boxed{}`) answers against gold answers in either form.

Each expected score is worked out by hand: 1.0 when the two final answers are the same number or expression.
"""

from __future__ import annotations

import threading

import pytest
from explorer_helpers import make_task

from trinity.explorer.rewards import REWARDS, evaluate_reward, get_reward
from trinity.explorer.rewards.math_verify import final_answer_text, normalize_answer


def reward(name: str, text: str, answer: str = "") -> float:
    outcome = evaluate_reward(get_reward(name), text, make_task(answer=answer))
    assert not outcome.failed, outcome.error
    return outcome.reward


def test_the_rewards_are_registered():
    assert {"math_verify", "final_answer", "math_verify_format"} <= set(REWARDS.names())


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        ("48 / 2 = 24 clips in May, 48 + 24 = 72.\n#### 72", "72", 1.0),
        ("#### 71", "72", 0.0),  # off by one
        ("She pays 1000 dollars.\n#### 1000", "1,000", 1.0),  # GSM8K gold keeps its thousands separator
        ("#### 1,000", "1000", 1.0),
        ("#### 1,234,567", "1234567", 1.0),
        ("#### $1,000.", "1000", 1.0),  # dollar sign and final period go
        ("#### 18", "Janet sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", 1.0),  # a whole GSM8K solution as gold
        ("The answer is 42.", "42", 1.0),  # no final answer: math-verify finds the last number
        ("I do not know", "42", 0.0),
    ],
)
def test_gsm8k_answers(text, gold, expected):
    assert reward("math_verify", text, gold) == expected


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        (r"So $x = \boxed{\frac{1}{2}}$.", r"\frac{1}{2}", 1.0),
        (r"\boxed{0.5}", r"\frac12", 1.0),  # 0.5 = 1/2
        (r"\boxed{1/2}", "0.5", 1.0),
        (r"\boxed{\frac12}", "1/2", 1.0),
        (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
        (r"\boxed{\dfrac{\sqrt{2}}{2}}", r"\frac{\sqrt2}{2}", 1.0),
        (r"\boxed{2\pi}", r"2\pi", 1.0),
        (r"\boxed{(1,2)}", "(1,2)", 1.0),  # an interval, not one thousand and two
        (r"\boxed{(1,3)}", "(1,2)", 0.0),
        (r"\boxed{x = 3}", "3", 1.0),
        (r"\boxed{12{,}000}", "12000", 1.0),  # MATH's thousands separator
        (r"first \boxed{3}, finally \boxed{4}", "4", 1.0),  # the last box counts
        (r"\boxed{}", "4", 0.0),
        (r"The solution is $\boxed{5}$. #### 4", r"\boxed{5}", 1.0),  # a box beats a later ####
    ],
)
def test_math_answers(text, gold, expected):
    assert reward("math_verify", text, gold) == expected


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        (r"\boxed{5\text{ cm}}", "5", 1.0),
        (r"\boxed{5 cm}", "5", 1.0),
        ("#### 5 cm", "5", 1.0),
        ("#### $5", "5", 1.0),
        (r"\boxed{\$18.90}", "18.9", 1.0),
        ("#### 42 dollars", "42", 1.0),
        (r"\boxed{10\%}", "10", 1.0),
        ("#### 6 cm", "5", 0.0),
    ],
)
def test_units_and_signs_are_dropped(text, gold, expected):
    assert reward("math_verify", text, gold) == expected


def test_normalizing_a_final_answer():
    assert normalize_answer("$1,000.") == "1000"
    assert normalize_answer("5 cm") == "5"
    assert normalize_answer(r"10\%") == "10"
    assert normalize_answer("(1,2)") == "(1,2)"
    assert normalize_answer("2 pi") == "2 pi"  # pi is no unit
    assert final_answer_text("work\n#### 42\nthanks") == "42"
    assert final_answer_text("<answer>7</answer>") == "7"
    assert final_answer_text("no answer") is None


@pytest.mark.parametrize(
    ("text", "expected"), [(r"\boxed{4}", 1.0), ("#### 4", 1.0), ("4", 0.0), (r"\boxed{ }", 0.0), ("####", 0.0)]
)
def test_final_answer_rewards_a_boxed_or_gsm8k_answer(text, expected):
    assert reward("final_answer", text) == expected


def test_math_verify_format_weighs_correctness_and_form():
    task = make_task(answer="1/2")
    boxed = evaluate_reward(get_reward("math_verify_format"), r"\boxed{0.5}", task)
    assert boxed.components == {"math_verify": 1.0, "final_answer": 1.0, "reward": pytest.approx(1.0)}
    unboxed = evaluate_reward(get_reward("math_verify_format"), "it is 0.5", task)
    assert unboxed.components == {"math_verify": 1.0, "final_answer": 0.0, "reward": pytest.approx(0.9)}
    wrong = evaluate_reward(get_reward("math_verify_format"), r"\boxed{0.4}", task)
    assert wrong.reward == pytest.approx(0.1)


def test_math_verify_scores_outside_the_main_thread():
    # math-verify's default time limits use SIGALRM, which raises outside the main thread; the reward turns them off.
    scores: list[float] = []
    worker = threading.Thread(
        target=lambda: scores.append(get_reward("math_verify")(r"\boxed{1/2}", make_task(answer="0.5")))
    )
    worker.start()
    worker.join(30)
    assert scores == [1.0]
