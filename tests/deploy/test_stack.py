"""`trinity stack`: the plan derived from docker-compose.yml, the container settings it turns into, and a
plain answer (exit 1, `trinity run` suggested) where no Docker engine answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trinity.cli.main import main
from trinity.cli.stack.compose import ComposeError, interpolate_text
from trinity.cli.stack.plan import compose_files, load_plan, parse_duration

ROOT = Path(__file__).resolve().parents[2]


def _plan(gpu: bool = False, profiles: frozenset[str] = frozenset(), env: dict | None = None):
    return load_plan(compose_files(ROOT, gpu=gpu), env=env or {}, profiles=profiles)


def test_services_start_after_what_they_depend_on():
    plan = _plan()
    assert [s.name for s in plan.services] == ["redis", "gateway", "buffer", "explorer", "trainer"]
    assert plan.network == "trinity_default"
    assert plan.volumes == ("trinity_redis-data", "trinity_trinity-data")


def test_the_quickstart_profile_adds_the_submitter_last():
    plan = _plan(profiles=frozenset({"quickstart"}))
    assert plan.services[-1].name == "quickstart"
    assert plan.services[-1].command == (
        "submit",
        "--gateway",
        "gateway:50051",
        "--config",
        "/examples/quickstart/config.yaml",
    )


def test_the_gpu_plan_reserves_one_gpu_each_for_explorer_and_trainer():
    plan = _plan(gpu=True, env={"TRINITY_TRAINER_GPUS": "2"})
    assert {s.name: s.gpus for s in plan.services} == {
        "redis": None, "gateway": None, "buffer": None, "explorer": 1, "trainer": 2,
    }  # fmt: skip


def test_interpolation_follows_compose_rules():
    env = {"SET": "v", "EMPTY": ""}
    cases = {
        "${SET:-d}": "v", "${EMPTY:-d}": "d", "${EMPTY-d}": "", "${UNSET-d}": "d",
        "${SET:+alt}": "alt", "${EMPTY:+alt}": "", "$$SET": "$SET", "$SET/x": "v/x", "${UNSET}": "",
    }  # fmt: skip
    assert {text: interpolate_text(text, env) for text in cases} == cases
    with pytest.raises(ComposeError, match="REQUIRED"):
        interpolate_text("${REQUIRED:?set it}", env)


def test_durations_read_like_compose():
    assert [parse_duration(t) for t in ("10s", "1m30s", "500ms", "2h", 5)] == [10, 90, 0.5, 7200, 5]


def test_a_dependency_cycle_is_reported(tmp_path):
    (tmp_path / "docker-compose.yml").write_text(
        "services:\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: x\n    depends_on: [a]\n"
    )
    with pytest.raises(ComposeError, match="cycle"):
        load_plan([tmp_path / "docker-compose.yml"], env={})


def test_container_settings_follow_the_plan():
    pytest.importorskip("docker")
    from trinity.cli.stack.engine import container_spec

    plan = _plan(gpu=True)
    explorer = container_spec(plan, plan.service("explorer"))
    assert explorer["name"] == "trinity-explorer-1" and explorer["image"] == "trinity/explorer:0.1.0-cuda"
    assert explorer["ports"] == {"9090/tcp": ("0.0.0.0", 9103)}
    assert explorer["volumes"] == {"trinity_trinity-data": {"bind": "/data", "mode": "rw"}}
    assert explorer["healthcheck"]["test"] == ["CMD", "python", "-m", "trinity.runtime.healthcheck"]
    assert explorer["healthcheck"]["interval"] == 10_000_000_000
    (gpu,) = explorer["device_requests"]
    assert (gpu["Driver"], gpu["Count"], gpu["Capabilities"]) == ("nvidia", 1, [["gpu"]])
    assert explorer["networking_config"]["trinity_default"]["Aliases"] == ["explorer"]
    assert "entrypoint" not in explorer  # the image's `trinity serve explorer`
    assert "device_requests" not in container_spec(plan, plan.service("gateway"))


def test_dry_run_prints_the_plan_without_an_engine(capsys):
    assert main(["stack", "up", "--dry-run", "-C", str(ROOT), "--gpu"]) == 0
    out = capsys.readouterr().out
    assert out.index("redis:") < out.index("gateway:") < out.index("buffer:") < out.index("explorer:")
    assert "trinity/trainer:0.1.0-cuda" in out and "gpus 1" in out


@pytest.mark.parametrize("action", ["up", "down", "status"])
def test_without_an_engine_stack_says_so_and_suggests_trinity_run(action, tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "stack", action, "-C", str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no Docker engine answers" in done.stderr and "trinity run" in done.stderr


def test_a_broken_compose_file_is_bad_input(tmp_path, capsys):
    (tmp_path / "docker-compose.yml").write_text("services:\n  a:\n    image: x\n    depends_on: [missing]\n")
    assert main(["stack", "up", "--dry-run", "-C", str(tmp_path)]) == 2
    assert "depends_on: missing is not defined" in capsys.readouterr().err


def _engine_reachable() -> bool:
    try:
        from trinity.cli.stack.engine import EngineUnavailable, connect

        connect()
        return True
    except (EngineUnavailable, ImportError):
        return False


@pytest.mark.skipif(not _engine_reachable(), reason="no Docker engine is reachable (DOCKER_HOST / docker.sock)")
def test_stack_up_status_down_on_a_real_engine():
    # Builds four images and starts five containers: minutes on a real engine.
    args = ["-C", str(ROOT)]
    try:
        assert main(["stack", "up", *args, "--timeout", "900"]) == 0
        assert main(["stack", "status", *args]) == 0
    finally:
        assert main(["stack", "down", *args]) == 0
