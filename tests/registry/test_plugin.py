"""examples/plugin: a package adds a workflow, a reward, an operator and an algorithm through entry points.

The package is installed into a temporary directory that only the child interpreters see, so the
venv is not changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin installed (no dependencies) into a fresh directory."""
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, work / "src")  # builds write into the source tree: keep the repo clean
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True,
        timeout=300,
    )  # fmt: skip
    return target


def run_python(site: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_plugin_names_resolve_in_their_registries(site: Path) -> None:
    done = run_python(
        site,
        """
        from trinity import algorithms as A
        from trinity.buffer.operators import OPERATORS
        from trinity.explorer.rewards import get_reward
        from trinity.explorer.workflows import create_workflow
        from trinity.v1 import common_pb2

        workflow = create_workflow("spell_backwards")
        task = common_pb2.Task(prompt="trinity", answer="ytinirt")
        assert type(workflow).__name__ == "SpellBackwardsWorkflow"
        assert "backwards" in workflow.prompt_text(task)
        assert workflow.reward_fn(task)(" YTINIRT ", task) == 1.0  # its default reward: the plugin's exact_match
        assert get_reward("exact_match")("trinity", task) == 0.0
        blank, said = common_pb2.Experience(response_text=" "), common_pb2.Experience(response_text="x")
        assert OPERATORS.get("drop_empty")([blank, said], None) == [said]
        preset = A.preset("grpo_seq_mean")
        assert preset.policy_loss_args["loss_agg_mode"] == "seq-mean-token-mean"
        """,
    )
    assert done.returncode == 0, done.stderr


def test_a_config_naming_the_plugin_names_validates(site: Path, tmp_path: Path) -> None:
    config = {
        "model": {"path": "smollm2"},
        "algorithm": {"algorithm_type": "grpo_seq_mean"},
        "buffer": {
            "taskset": {"path": "words.jsonl", "reward_fn": "composite:exact_match=0.9,format=0.1"},
            "experience_stream": {"operators": [{"name": "drop_empty"}]},
        },
        "explorer": {"workflow": "spell_backwards"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_python(
        site,
        """
        import sys
        from trinity.config import load_run_config
        config = load_run_config(sys.argv[1])
        print(config.explorer.workflow, config.algorithm.algorithm_type)
        """,
        str(path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["spell_backwards", "grpo_seq_mean"]


def test_without_the_plugin_the_same_names_are_unknown() -> None:
    from trinity.registry import check_name

    with pytest.raises(ValueError, match="unknown 'spell_backwards'"):
        check_name("workflow", "spell_backwards")


def test_a_plugin_may_not_reuse_a_builtin_name(tmp_path: Path) -> None:
    # The smallest installed distribution: metadata and entry points, as pip writes them.
    dist = tmp_path / "clash-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: clash\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[trinity.rewards]\nmath = clash_rewards:math\n")
    done = run_python(
        tmp_path,
        """
        from trinity.registry import check_name
        check_name("reward", "accuracy")
        """,
    )
    assert done.returncode != 0
    assert "entry point math = 'clash_rewards:math' (group 'trinity.rewards') reuses a built-in name" in done.stderr
