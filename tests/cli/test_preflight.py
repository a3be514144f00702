"""`trinity run` / `bench` / `submit` check the config before anything starts: exit 2, naming the field.

`run` and `bench` check the files the config names on this machine; `submit` checks every stage (and so every
registry name in it) but no files, which the buffer and explorers read on their own machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import ServiceProcess
from trinity.cli.preflight import data_roots_env, local_run
from trinity.config import load_run_config
from trinity.runtime.redis_server import start_redis_server
from trinity.sdk import TrinityClient

BAD_INPUT = 2


def _trinity(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRINITY_AUTH_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture
def files(tmp_path: Path, tiny_model: Path) -> dict[str, Path]:
    tasks = tmp_path / "data" / "tasks.jsonl"
    tasks.parent.mkdir()
    tasks.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    return {"tasks": tasks, "model": tiny_model, "dir": tmp_path}


def _config(files: dict[str, Path], **changes: object) -> Path:
    config: dict = {
        "model": {"path": str(files["model"])},
        "buffer": {
            "taskset": {"path": str(files["tasks"])},
            "eval_tasksets": [{"name": "heldout", "path": str(files["tasks"])}],
        },
    }
    for dotted, value in changes.items():
        node = config
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    out = files["dir"] / "config.yaml"
    out.write_text(yaml.safe_dump(config))
    return out


def _run_refused(files: dict[str, Path], config: Path) -> str:
    """`trinity run` on `config`: exit 2, nothing started (no output folder); returns stderr."""
    output = files["dir"] / "out"
    done = _trinity("run", "--config", str(config), "--output", str(output), "--quiet")
    assert done.returncode == BAD_INPUT, done.stdout + done.stderr
    assert not output.exists() and "starting redis" not in done.stdout
    return done.stderr


def test_run_with_a_missing_task_file_exits_2_naming_the_field(files):
    stderr = _run_refused(files, _config(files, **{"buffer.taskset.path": "missing.jsonl"}))
    assert f"buffer.taskset.path: no such file: {files['dir'] / 'missing.jsonl'}" in stderr


def test_run_with_a_missing_eval_file_names_its_position(files):
    config = _config(files, **{"buffer.eval_tasksets": [{"name": "e", "path": "/nowhere/eval.jsonl"}]})
    assert "buffer.eval_tasksets[0].path: no such file: /nowhere/eval.jsonl" in _run_refused(files, config)


def test_run_with_a_missing_file_among_several_task_sets_names_its_position(files):
    sets = [{"name": "a", "path": str(files["tasks"])}, {"name": "b", "path": "/nowhere/b.jsonl"}]
    config = _config(files, **{"buffer.taskset": None, "buffer.tasksets": sets})
    assert "buffer.tasksets[1].path: no such file: /nowhere/b.jsonl" in _run_refused(files, config)


def test_run_with_a_missing_model_directory_exits_2_naming_the_field(files):
    assert "model.path: no such directory" in _run_refused(files, _config(files, **{"model.path": "/nowhere/model"}))


def test_run_with_an_unknown_workflow_exits_2_naming_the_field(files):
    assert "explorer.workflow: unknown 'mathh'" in _run_refused(files, _config(files, **{"explorer.workflow": "mathh"}))


def test_run_with_an_unknown_name_in_a_later_stage_exits_2_naming_the_stage(files):
    config = _config(files, stages=[{"explorer": {"workflow": "mathh"}}])
    stderr = _run_refused(files, config)
    assert "stages[0]" in stderr and "mathh" in stderr


def test_run_with_a_missing_file_in_a_later_stage_names_the_stage(files):
    config = _config(files, stages=[{"buffer": {"taskset": {"path": "/nowhere/stage2.jsonl"}}}])
    assert "stages[0].buffer.taskset.path: no such file: /nowhere/stage2.jsonl" in _run_refused(files, config)


def test_bench_with_a_missing_eval_file_exits_2_naming_the_field(files):
    config = _config(files, **{"buffer.eval_tasksets": [{"name": "e", "path": "/nowhere/eval.jsonl"}]})
    done = _trinity("bench", "--config", str(config), "--output", str(files["dir"] / "out"), "--quiet")
    assert done.returncode == BAD_INPUT
    assert "buffer.eval_tasksets[0].path: no such file" in done.stderr


def test_submit_with_an_unknown_name_in_a_stage_exits_2_without_calling_the_gateway(files):
    config = _config(files, stages=[{"buffer": {"taskset": {"reward_fn": "accuracyy"}}}])
    done = _trinity("submit", "--config", str(config), "--gateway", "127.0.0.1:1")  # nothing listens there
    assert done.returncode == BAD_INPUT, done.stdout + done.stderr
    assert "stages[0]" in done.stderr and "accuracyy" in done.stderr


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServiceProcess]:
    redis = start_redis_server()
    service = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis.url}).start()
    yield service
    service.stop()
    redis.stop()


def test_submit_leaves_the_files_to_the_servers_machines(files, gateway):
    """A task file that does not exist here may exist where the buffer runs (`/examples` in compose)."""
    config = _config(files, **{"buffer.taskset.path": "/examples/only-in-the-container.jsonl"})
    done = _trinity("submit", "--config", str(config), "--gateway", gateway.address)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.split()[1]  # "run <id> submitted"
    with TrinityClient(gateway.address) as client:
        client.run(run_id).cancel()


def test_the_local_buffer_may_read_only_the_configs_files_and_write_the_output(files):
    config = local_run(load_run_config(_config(files)))
    roots = data_roots_env(config.stage_configs(), files["dir"] / "out")["TRINITY_DATA_ROOTS"].split(os.pathsep)
    assert roots == [str(files["tasks"].resolve()), str(files["dir"] / "out")]


def test_a_textworld_runs_games_dir_is_a_data_root_so_tasks_may_name_game_files_in_it(files):
    games = files["dir"] / "games"
    overrides = {"explorer.workflow": "textworld", "explorer.workflow_options": {"games_dir": str(games)}}
    config = local_run(load_run_config(_config(files, **overrides)))
    roots = data_roots_env(config.stage_configs(), files["dir"] / "out")["TRINITY_DATA_ROOTS"].split(os.pathsep)
    assert roots == [str(files["tasks"].resolve()), str(games.resolve()), str(files["dir"] / "out")]
