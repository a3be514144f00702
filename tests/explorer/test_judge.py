"""Judge rewards: a judge model served locally over HTTP (Trinity's OpenAI-compatible endpoint) scores groups.

The judge that must give known scores is a scripted engine behind the real endpoint: it reads the
prompt the reward sent and answers by a rule, so the test knows the right scores without trusting a
model. The tiny random Llama, served the same way and started by the explorer as a second engine,
is the judge whose replies are unusable: its responses fall back, counted.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from explorer_helpers import scripted_runner
from prometheus_client import REGISTRY

from tests.explorer.explorer_helpers import make_task
from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, TaskSetConfig, naming
from trinity.config.explorer import JudgeConfig
from trinity.explorer.engines.base import Engine, SamplingSettings
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
from trinity.explorer.rewards import evaluate_reward, get_reward
from trinity.explorer.rewards.judge import parse_ranking, parse_rubric_score, reply_json
from trinity.explorer.rewards.judge_client import EngineJudge, JudgeError, JudgeSettings, build_judge
from trinity.explorer.workflows import create_workflow
from trinity.explorer.workflows.base import RolloutSettings

RESPONSES = ["The answer is 42.", "I think it is 41.", "Maybe 42, maybe not.", "No idea."]
_BLOCK = re.compile(r'<response id="(\d+)">\n(.*?)\n</response>', re.DOTALL)


def fallbacks() -> float:
    return REGISTRY.get_sample_value("trinity_explorer_judge_fallbacks_total") or 0.0


def ranking_judge(prompt: str) -> str:
    """Scores each response of the prompt: 1 if it commits to 42, 0.5 if it hedges, else 0 (ids in reverse)."""
    blocks = _BLOCK.findall(prompt)
    scores = [{"id": int(i), "score": 0.5 if "aybe" in t else 1.0 if "42" in t else 0.0} for i, t in blocks]
    return "<think>comparing</think>" + json.dumps({"scores": scores[::-1]})


def rubric_judge(prompt: str) -> str:
    """Half a point for naming the number the rubric asks for, half for a full sentence ending in '.'."""
    rubric = re.search(r"<rubric>\n(.*?)\n</rubric>", prompt, re.DOTALL)
    response = re.search(r"<response>\n(.*?)\n</response>", prompt, re.DOTALL)
    assert rubric and response, prompt
    wanted = re.search(r"\d+", rubric.group(1))
    text = response.group(1)
    score = 0.5 * (wanted is not None and wanted.group(0) in text) + 0.5 * text.endswith(".")
    return f"```json\n{json.dumps({'score': score})}\n```"


@contextlib.contextmanager
def serve(engine: Engine, api_key: str | None = None) -> Iterator[str]:
    backend = ServeBackend(engine=lambda: engine, put=lambda exps: 0, model_name="judge", api_key=api_key)
    server = OpenAIServer(create_app(backend))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def judge_server(tokenizer: Any) -> Iterator[Callable[[Callable[[str], str]], str]]:
    """Serve a scripted judge at a local URL; every server started is stopped at teardown."""
    with contextlib.ExitStack() as servers:
        yield lambda reply: servers.enter_context(serve(ScriptedEngine(tokenizer, reply)))


def policy(tokenizer: Any) -> ScriptedEngine:
    answers = itertools.cycle(RESPONSES)
    return ScriptedEngine(tokenizer, lambda prompt: next(answers))


def settings_for(url: str, **overrides: Any) -> RolloutSettings:
    config = JudgeConfig(base_url=url, model="judge", max_tokens=256, **overrides)
    return RolloutSettings(
        repeat_times=len(RESPONSES), sampling=SamplingSettings(max_tokens=64), judge=build_judge(config)
    )


def run_group(tokenizer: Any, settings: RolloutSettings, reward: str, **payload: Any) -> list[Any]:
    workflow = create_workflow("math")
    return workflow.run(
        make_task(prompt="What is 6 * 7?", answer="", reward_fn=reward, **payload), policy(tokenizer), settings
    )


def test_ruler_scores_the_group_as_the_judge_ranked_it(tokenizer: Any, judge_server: Any) -> None:
    exps = run_group(tokenizer, settings_for(judge_server(ranking_judge)), "judge_ruler")
    assert [e.response_text for e in exps] == RESPONSES
    assert [e.reward for e in exps] == [1.0, 0.0, 0.5, 0.0]
    assert [e.reward_components["judge"] for e in exps] == [1.0, 0.0, 0.5, 0.0]
    assert not any(e.failed or "judge_fallback" in e.reward_components for e in exps)
    assert len({e.group_id for e in exps}) == 1


def test_rubric_scores_each_response_against_the_tasks_rubric(tokenizer: Any, judge_server: Any) -> None:
    settings = settings_for(judge_server(rubric_judge), rubric="unused: the task has its own")
    exps = run_group(tokenizer, settings, "judge_rubric", rubric="Names 42 in a full sentence.")
    assert [e.reward for e in exps] == [1.0, 0.5, 1.0, 0.5]  # "...41." and "No idea." only end a sentence


def test_rubric_falls_back_to_the_configured_rubric(tokenizer: Any, judge_server: Any) -> None:
    settings = settings_for(judge_server(rubric_judge), rubric="Must name 41.")
    exps = run_group(tokenizer, settings, "judge_rubric")
    assert [e.reward for e in exps] == [0.5, 1.0, 0.5, 0.5]


def test_a_judge_that_never_answers_times_out_to_the_counted_fallback(tokenizer: Any, judge_server: Any) -> None:
    release = threading.Event()

    def stuck(prompt: str) -> str:
        release.wait(30)  # bounded: released at the end of the test
        return ranking_judge(prompt)

    settings = settings_for(judge_server(stuck), timeout_seconds=0.3, max_attempts=2, fallback_reward=-1.0)
    before = fallbacks()
    try:
        exps = run_group(tokenizer, settings, "judge_ruler")
    finally:
        release.set()
    assert [e.reward for e in exps] == [-1.0] * len(RESPONSES)
    assert all(e.reward_components["judge_fallback"] == 1.0 and not e.failed for e in exps)
    assert fallbacks() - before == len(RESPONSES)


def test_a_tiny_model_judge_started_by_trinity_answers_and_its_unusable_replies_fall_back(
    tokenizer: Any, tiny_model_dir: Path
) -> None:
    judging = build_judge(JudgeConfig(model=str(tiny_model_dir), max_tokens=8, max_attempts=1, fallback_reward=0.25))
    try:
        assert isinstance(judging.judge, EngineJudge)
        reply = judging.judge.complete([{"role": "user", "content": "Score this."}])
        assert isinstance(reply, str)  # random weights: a reply, never the JSON asked for
        with pytest.raises(JudgeError):
            parse_ranking(reply, len(RESPONSES))
        before = fallbacks()
        settings = RolloutSettings(repeat_times=len(RESPONSES), sampling=SamplingSettings(max_tokens=64), judge=judging)
        exps = run_group(tokenizer, settings, "judge_ruler")
    finally:
        judging.judge.close()
    assert [e.reward for e in exps] == [0.25] * len(RESPONSES)
    assert fallbacks() - before == len(RESPONSES)


def test_a_scripted_engine_judge_scores_like_the_http_one(tokenizer: Any) -> None:
    judging = JudgeSettings(judge=EngineJudge(ScriptedEngine(tokenizer, ranking_judge), max_tokens=256))
    settings = RolloutSettings(repeat_times=len(RESPONSES), sampling=SamplingSettings(max_tokens=64), judge=judging)
    assert [e.reward for e in run_group(tokenizer, settings, "judge_ruler")] == [1.0, 0.0, 0.5, 0.0]


def test_a_wrong_bearer_token_is_a_judge_failure_not_a_crash(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve(ScriptedEngine(tokenizer, ranking_judge), api_key="right") as url:
        monkeypatch.setenv("JUDGE_KEY", "wrong")
        settings = settings_for(url, api_key_env="JUDGE_KEY", max_attempts=1)
        exps = run_group(tokenizer, settings, "judge_ruler")
        assert all(e.reward_components["judge_fallback"] == 1.0 for e in exps)
        monkeypatch.setenv("JUDGE_KEY", "right")
        exps = run_group(tokenizer, settings_for(url, api_key_env="JUDGE_KEY"), "judge_ruler")
        assert [e.reward for e in exps] == [1.0, 0.0, 0.5, 0.0]


def test_an_unset_api_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_JUDGE_KEY"):
        build_judge(JudgeConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="NO_SUCH_JUDGE_KEY"))


def test_a_judge_reward_without_a_judge_says_to_configure_one(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match=r"set explorer\.judge"):
        run_group(tokenizer, RolloutSettings(repeat_times=2), "judge_ruler")


def test_a_judge_reward_inside_a_composite_fails_the_sample_with_the_reason() -> None:
    outcome = evaluate_reward(get_reward("composite:judge_ruler=1.0"), "text", make_task(prompt="p"))
    assert outcome.failed and "scores the responses to a task together" in outcome.error


@pytest.mark.parametrize(
    ("reply", "scores"),
    [
        ('{"scores": [{"id": 2, "score": 0.1}, {"id": 1, "score": 1}]}', [1.0, 0.1]),
        ('Sure.\n```json\n{"scores": [0.3, 0.6]}\n```', [0.3, 0.6]),
        ('<think>{"scores": [9, 9]}</think>{"scores": [0, 1]}', [0.0, 1.0]),
    ],
)
def test_parse_ranking_reads_ids_fences_and_thoughts(reply: str, scores: list[float]) -> None:
    assert parse_ranking(reply, 2) == scores


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ('{"scores": [0.5]}', "2 entries"),
        ('{"scores": [0.5, 1.5]}', r"not a number in \[0, 1\]"),
        ('{"scores": [{"id": 1, "score": 0.5}, {"id": 3, "score": 0.5}]}', r"expected 1\.\.2"),
        ('{"scores": [true, 0.5]}', "not a number"),
        ("no json here", "no JSON object"),
        ('{"scores": [0.5, }', "not valid JSON"),
    ],
)
def test_parse_ranking_rejects_what_is_not_a_full_ranking(reply: str, problem: str) -> None:
    with pytest.raises(JudgeError, match=problem):
        parse_ranking(reply, 2)


def test_parse_rubric_score_needs_a_score() -> None:
    assert parse_rubric_score('{"score": 0.75}') == 0.75
    with pytest.raises(JudgeError, match="no 'score'"):
        parse_rubric_score('{"grade": 1}')
    assert reply_json('{"a": {"b": 1}}') == {"a": {"b": 1}}


def test_the_config_takes_a_judge_and_checks_its_fields(tmp_path: Path) -> None:
    raw = {
        "mode": "explore",
        "model": {"path": str(tmp_path)},
        "buffer": {"taskset": {"name": "t", "path": str(tmp_path / "t.jsonl"), "reward_fn": "judge_rubric"}},
        "explorer": {"judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen", "rubric": "Be right."}},
    }
    config = RunConfig.model_validate(raw)
    assert config.explorer.judge is not None and config.explorer.judge.model == "qwen"
    without = {**raw, "explorer": {}}
    with pytest.raises(ValueError, match=r"explorer\.judge: required by task set 't'"):
        RunConfig.model_validate(without)
    with pytest.raises(ValueError, match="max_attempts"):
        JudgeConfig(model="m", max_attempts=0)
    with pytest.raises(ValueError, match="model"):
        JudgeConfig.model_validate({"base_url": "http://x/v1"})


def explore_config(model_dir: Path, data: Path, judge: dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate(
        {
            "mode": "explore",
            "model": {"path": str(model_dir), "max_response_tokens": 32},
            "algorithm": {"repeat_times": len(RESPONSES)},
            "buffer": {
                "batch_size": 1,
                "total_steps": 2,
                "taskset": {"path": str(data), "prompt_key": "question", "reward_fn": "judge_ruler"},
            },
            "explorer": {"judge": judge},
        }
    )


@pytest.mark.parametrize("judge_up", [True, False], ids=["judge", "judge-down"])
def test_explore_mode_puts_judge_scored_groups_and_survives_a_dead_judge(
    judge_up: bool,
    buffer_service: Any,
    gateway: Any,
    tiny_model_dir: Path,
    tokenizer: Any,
    tmp_path: Path,
    unique: str,
    judge_server: Any,
) -> None:
    data = tmp_path / "open.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("What is 6 * 7?", "Name 42.")))
    # Port 9 (discard) on loopback refuses connections: the judge is down, every call fails at once.
    url = judge_server(ranking_judge) if judge_up else "http://127.0.0.1:9/v1"
    judge = {"base_url": url, "model": "judge", "max_attempts": 1, "fallback_reward": -0.5}
    config = explore_config(tiny_model_dir, data, judge)
    assert config.buffer.taskset is not None
    name, stream = naming.taskset(unique, 0, "train"), naming.experience_stream(unique, 0)
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_taskset(TaskSetConfig(name=name, **config.buffer.taskset.model_dump(exclude={"name"})))
        buffer.create_stream(StreamConfig(name=stream))
        runner = scripted_runner(config, unique, buffer_service, gateway, policy(tokenizer), "explorer-judge-test")
        runner.start()
        runner.join(timeout=60)
        assert runner.state == "finished" and runner.step == 2
        exps = list(buffer.read(stream, "reader", 20).experiences)
    assert len(exps) == 2 * len(RESPONSES)
    by_group: dict[str, list[float]] = {}
    for e in exps:
        by_group.setdefault(e.group_id, []).append(e.reward)
    expected = [1.0, 0.0, 0.5, 0.0] if judge_up else [-0.5] * len(RESPONSES)
    assert sorted(by_group.values()) == [expected, expected]
    assert all(("judge_fallback" in e.reward_components) is not judge_up for e in exps)
