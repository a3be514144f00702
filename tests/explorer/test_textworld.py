"""TextWorld games on the real engine: generation, admissible commands, walkthroughs, invalid replies, state keys."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from explorer_helpers import make_task

from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.explorer.workflows.textworld import GameSpec, TextWorldEnvironment, generated_game, parse_command

GAME = {"nb_rooms": 2, "nb_objects": 3, "quest_length": 2, "game_seed": 7}


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("textworld-games")


@pytest.fixture(scope="module")
def walkthrough(games_dir: Path) -> list[str]:
    """The game's own solution, as TextWorld's generator wrote it beside the compiled game."""
    import textworld

    path = generated_game(GameSpec(**GAME), games_dir)
    commands = textworld.Game.load(str(path.with_suffix(".json"))).walkthrough
    assert commands, "the generated game has no walkthrough"
    return list(commands)


@pytest.fixture
def env(games_dir: Path) -> Iterator[TextWorldEnvironment]:
    environment = TextWorldEnvironment(make_task(**GAME), games_dir=games_dir)
    yield environment
    environment.close()


def answer(command: str) -> str:
    return f"<think>the next step</think><answer>{command}</answer>"


def test_a_generated_game_is_the_same_for_the_same_seed_and_differs_for_another(tmp_path, games_dir, walkthrough):
    import textworld

    again = generated_game(GameSpec(**GAME), tmp_path / "again")
    other = generated_game(GameSpec(**{**GAME, "game_seed": 8}), tmp_path / "other")
    first = json.loads(generated_game(GameSpec(**GAME), games_dir).with_suffix(".json").read_text())
    assert json.loads(again.with_suffix(".json").read_text()) == first
    assert textworld.Game.load(str(other.with_suffix(".json"))).walkthrough != walkthrough


def test_a_cached_game_is_not_compiled_again(games_dir):
    path = generated_game(GameSpec(**GAME), games_dir)
    modified = path.stat().st_mtime_ns
    assert generated_game(GameSpec(**GAME), games_dir) == path
    assert path.stat().st_mtime_ns == modified


def test_episodes_on_many_threads_generate_and_start_their_games(tmp_path):
    """The explorer runs each task's episodes on a thread of its own; TextWorld's parser is not thread-safe."""
    tasks = [make_task(**{**GAME, "game_seed": seed}) for seed in range(4)]

    def play(task):
        environment = TextWorldEnvironment(task, games_dir=tmp_path)
        try:
            return environment.reset(task, seed=0)
        finally:
            environment.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        observations = list(pool.map(play, tasks))
    assert all("Admissible commands:" in o for o in observations) and len(set(observations)) == 4


def test_reset_shows_the_feedback_and_the_admissible_commands(env):
    observation = env.reset(make_task(**GAME), seed=0)
    feedback, listed = observation.split("\n\nAdmissible commands:\n")
    # The quest and the room, without TextWorld's ASCII-art banner and the interpreter's status bar.
    assert feedback == f"{env.state['objective']}\n\n{env.state['description']}"
    assert "$$" not in feedback and "you win" in feedback
    commands = [line.removeprefix("- ") for line in listed.splitlines()]
    assert commands == list(env.state["admissible_commands"]) and "look" in commands


def test_the_walkthrough_wins_with_the_whole_score(env, walkthrough):
    env.reset(make_task(**GAME), seed=0)
    outcomes = [env.step(answer(command)) for command in walkthrough]
    assert sum(o.reward for o in outcomes) == pytest.approx(1.0)
    assert [o.done for o in outcomes] == [False] * (len(walkthrough) - 1) + [True]
    assert outcomes[-1].info["success"] and not any(o.info.get("invalid_action") for o in outcomes)


def test_an_inadmissible_reply_costs_no_game_step(env):
    env.reset(make_task(**GAME), seed=0)
    key, moves = env.state_key(), env.state["moves"]
    outcome = env.step(answer("dance with the dragon"))
    assert outcome.info == {"invalid_action": True} and outcome.reward == 0.0 and not outcome.done
    assert "'dance with the dragon' is not an admissible command" in outcome.observation
    assert env.state["moves"] == moves and env.state_key() == key


def test_commands_match_case_insensitively_and_without_tags(env):
    env.reset(make_task(**GAME), seed=0)
    moves = env.state["moves"]
    assert not env.step("I should look around.\n  LOOK ").info.get("invalid_action")
    assert env.state["moves"] == moves + 1


def test_state_keys_are_equal_for_equal_states_and_differ_otherwise(games_dir, env, walkthrough):
    env.reset(make_task(**GAME), seed=0)
    other = TextWorldEnvironment(make_task(**GAME), games_dir=games_dir)
    try:
        other.reset(make_task(**GAME), seed=0)
        assert env.state_key() == other.state_key()
        env.step(answer("look"))  # looking changes nothing in the world
        assert env.state_key() == other.state_key()
        env.step(answer(walkthrough[0]))
        assert env.state_key() != other.state_key()
        other.step(answer(walkthrough[0]))
        assert env.state_key() == other.state_key()
    finally:
        other.close()


def test_a_game_file_inside_the_data_roots_is_played(games_dir):
    path = generated_game(GameSpec(**GAME), games_dir)  # under the temp folder, a data root of the tests
    by_file = TextWorldEnvironment(make_task(game_file=str(path)), games_dir=games_dir)
    by_parameters = TextWorldEnvironment(make_task(**GAME), games_dir=games_dir)
    try:
        assert by_file.reset(make_task(), seed=0) == by_parameters.reset(make_task(), seed=0)
    finally:
        by_file.close()
        by_parameters.close()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"game_file": "/etc/hostname"}, r"payload.game_file: '/etc/hostname' is outside the data roots"),
        ({"game_file": "x.ulx", "game_seed": 1}, r"payload: give game_file or generation parameters, not both"),
        ({"nb_rooms": 0}, r"payload.nb_rooms: a whole number >= 1"),
        ({"game_seed": 1.5}, r"payload.game_seed: a whole number >= 0 \(got 1.5\)"),
        ({"nb_objects": "many"}, r"payload.nb_objects: a whole number >= 0 \(got string_value\)"),
    ],
)
def test_a_bad_payload_is_refused_naming_the_field(games_dir, payload, message):
    with pytest.raises(ValueError, match=message):
        TextWorldEnvironment(make_task(**payload), games_dir=games_dir)


@pytest.mark.parametrize(
    ("reply", "command"),
    [("<answer>Open Door</answer>", "open door"), ("think...\ngo  east.", "go east"), ("", "")],
)
def test_the_command_parser(reply, command):
    assert parse_command(reply) == command


def test_the_workflow_plays_the_walkthrough_into_rewarded_steps_with_state_keys(tokenizer, games_dir, walkthrough):
    replies = iter([answer(c) for c in walkthrough for _ in range(2)])  # two episodes in lockstep
    engine = ScriptedEngine(tokenizer, lambda prompt: next(replies))
    workflow = create_workflow("textworld", games_dir=str(games_dir))
    exps = workflow.run(make_task(task_id="tw/0", **GAME), engine, RolloutSettings(repeat_times=2))
    assert len(exps) == 2 * len(walkthrough)
    episodes = {e.episode_id for e in exps}
    assert len(episodes) == 2
    first, second = ([e for e in exps if e.episode_id == episode] for episode in episodes)
    assert [e.state_key for e in first] == [e.state_key for e in second]
    assert len({e.state_key for e in first}) == len(walkthrough)  # every step of the solution changes the world
    assert sum(e.reward_components["step_reward"] for e in first) == pytest.approx(1.0)
    assert all(e.reward == pytest.approx(1.0) and e.metrics["success"] == 1.0 for e in exps)
    assert all(e.info["ended_by"] == "environment" for e in exps)
    assert "Admissible commands:" in first[0].prompt_text


def test_the_workflow_counts_invalid_replies_until_max_steps(tokenizer, games_dir):
    engine = ScriptedEngine(tokenizer, lambda prompt: "I am not sure what to do")
    exps = create_workflow("textworld", max_steps=3, games_dir=str(games_dir)).run(
        make_task(**GAME), engine, RolloutSettings()
    )
    assert len(exps) == 3 and len({e.state_key for e in exps}) == 1
    assert all(e.metrics["invalid_action"] == 1.0 and e.reward == 0.0 for e in exps)
    assert exps[-1].info["ended_by"] == "max_steps"


def test_an_explorer_without_the_text_games_extra_is_told_what_to_install():
    from trinity.explorer.workflows.base import needs_package

    needs_package("textworld", "text-games", "the textworld workflow")  # installed here: no error
    with pytest.raises(ValueError, match=r"the textworld workflow needs the no_such_package_here package: "):
        needs_package("no_such_package_here", "text-games", "the textworld workflow")
    with pytest.raises(ValueError, match=re.escape("pip install 'trinity-explorer[text-games]'")):
        needs_package("no_such_package_here", "text-games", "the textworld workflow")
