"""The text-game environments' own costs, no model: TextWorld game generation and steps, ScienceWorld's JVM and steps.

`python -m benchmarks --only text_games` writes results/text_games.json. TextWorld: seconds to generate and compile a
game (the example's size), a cached lookup, starting and resetting an episode, and game steps per second playing each
game's walkthrough. ScienceWorld: seconds to start its JVM, to load and reset a task, and steps per second.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from benchmarks.common import write_result
from trinity.v1 import common_pb2

SCIENCEWORLD_ACTIONS = ("look around", "inventory", "open door to kitchen", "go to kitchen", "look around")


def _task(**payload: Any) -> common_pb2.Task:
    struct = struct_pb2.Struct()
    struct.update(payload)
    return common_pb2.Task(id="bench/0", payload=struct)


def _textworld(seeds: range, games_dir: Path) -> dict[str, Any]:
    import textworld

    from trinity.explorer.workflows.textworld import GameSpec, TextWorldEnvironment, generated_game

    compile_s, start_s, steps_per_s = [], [], []
    for seed in seeds:
        spec = GameSpec(nb_rooms=2, nb_objects=4, quest_length=2, game_seed=seed)
        begin = time.perf_counter()
        path = generated_game(spec, games_dir)
        compile_s.append(time.perf_counter() - begin)
        walkthrough = textworld.Game.load(str(path.with_suffix(".json"))).walkthrough
        task = _task(nb_rooms=2, nb_objects=4, quest_length=2, game_seed=seed)
        begin = time.perf_counter()
        env = TextWorldEnvironment(task, games_dir=games_dir)
        env.reset(task, seed=0)
        start_s.append(time.perf_counter() - begin)
        begin, steps = time.perf_counter(), 0
        for _ in range(10):
            env.reset(task, seed=0)
            for command in walkthrough:
                env.step(f"<answer>{command}</answer>")
                env.state_key()
                steps += 1
        steps_per_s.append(steps / (time.perf_counter() - begin))
        env.close()
    begin = time.perf_counter()
    generated_game(GameSpec(nb_rooms=2, nb_objects=4, quest_length=2, game_seed=seeds[0]), games_dir)
    return {
        "game": "2 rooms, 4 objects, quest length 2",
        "generate_and_compile_s": [round(s, 3) for s in compile_s],
        "cached_lookup_ms": round((time.perf_counter() - begin) * 1000, 3),
        "start_and_reset_s_median": round(statistics.median(start_s), 3),
        "walkthrough_steps_per_s": [round(s) for s in steps_per_s],
    }


def _scienceworld(tasks: tuple[str, ...]) -> dict[str, Any]:
    from trinity.explorer.workflows.scienceworld import ScienceWorldEnvironment

    rows = []
    for name in tasks:
        task = _task(task_name=name, variation=0, simplifications="easy")
        begin = time.perf_counter()
        env = ScienceWorldEnvironment(task)
        started = time.perf_counter()
        env.reset(task, seed=0)
        loaded = time.perf_counter()
        for action in SCIENCEWORLD_ACTIONS:
            env.step(action)
        stepped = time.perf_counter()
        env.close()
        rows.append(
            {
                "task": name,
                "jvm_start_s": round(started - begin, 2),
                "load_and_reset_s": round(loaded - started, 2),
                "steps_per_s": round(len(SCIENCEWORLD_ACTIONS) / (stepped - loaded), 1),
                "close_s": round(time.perf_counter() - stepped, 2),
            }
        )
    return {"simplifications": "easy", "variation": 0, "tasks": rows}


def run(quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as games_dir:
        textworld = _textworld(range(2 if quick else 4), Path(games_dir))
    tasks = ("find-non-living-thing",) if quick else ("find-non-living-thing", "find-living-thing", "find-plant")
    result = {"textworld": textworld, "scienceworld": _scienceworld(tasks)}
    write_result("text_games", result)
    return result
