"""The registries: one mechanism for every extension point, built-in tables that match the code, names
checked when a config is parsed."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from trinity.config import ExplorerConfig, OptimizerSection, TrainerConfig, load_run_config, parse_run_config
from trinity.config.explorer import WORKFLOW_OPTIONS
from trinity.config.sync import SyncMethod
from trinity.registry import DuplicateNameError, Registry, UnknownNameError, check_name
from trinity.registry_names import KINDS
from trinity.sync.spec import ChecksumName, SyncBackend

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "config.yaml"

# Where each kind's registry lives: the services own their registries, the table only names modules.
REGISTRIES = {
    "algorithm": "trinity.config.algorithm:PRESETS",
    "advantage": "trinity.algorithms.registry:ADVANTAGES",
    "policy_loss": "trinity.algorithms.registry:POLICY_LOSSES",
    "kl_estimator": "trinity.algorithms.registry:KL_ESTIMATORS",
    "entropy_term": "trinity.algorithms.registry:ENTROPY_TERMS",
    "value_loss": "trinity.algorithms.registry:VALUE_LOSSES",
    "loss_agg_mode": "trinity.algorithms.aggregation:LOSS_AGGREGATIONS",
    "workflow": "trinity.explorer.workflows.base:WORKFLOWS",
    "step_environment": "trinity.explorer.workflows.multi_step:STEP_ENVIRONMENTS",
    "chat_environment": "trinity.explorer.workflows.multi_turn:CHAT_ENVIRONMENTS",
    "tool": "trinity.explorer.tools.base:TOOLS",
    "agent": "trinity.explorer.workflows.agentscope:AGENTS",
    "reward": "trinity.explorer.rewards.base:REWARDS",
    "engine": "trinity.explorer.engines.registry:ENGINES",
    "operator": "trinity.buffer.operators.registry:OPERATORS",
    "selector": "trinity.buffer.tasksets.selectors:SELECTORS",
    "trainer_backend": "trinity.trainer.backend:BACKENDS",
    "lr_schedule": "trinity.trainer.optim:SCHEDULES",
    "sync_backend": "trinity.sync.interface:BACKENDS",
    "checksum": "trinity.sync.checksum:CHECKSUMS",
}
BUILTINS = [(kind, name) for kind, row in KINDS.items() for name in row.builtins]


def registry(kind: str) -> Registry[Any]:
    module, attr = REGISTRIES[kind].split(":")
    return getattr(importlib.import_module(module), attr)


# --- the built-in tables and the code agree -------------------------------------------------------


def test_every_kind_of_the_table_has_its_registry():
    assert set(REGISTRIES) == set(KINDS)
    for kind in KINDS:
        assert (registry(kind).kind, registry(kind).builtins) == (kind, KINDS[kind].builtins)


@pytest.mark.parametrize(("kind", "name"), BUILTINS)
def test_every_builtin_name_is_registered_by_the_module_the_table_names(kind, name):
    obj = registry(kind).get(name)  # imports the table's module; fails if that did not register `name`
    if inspect.isfunction(obj) or inspect.isclass(obj):  # presets and sync backends are data, not code
        assert obj.__module__ == KINDS[kind].builtins[name]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_registered_builtin_is_in_the_table(kind):
    for name in KINDS[kind].builtins:
        registry(kind).get(name)
    plugins = {point.name for point in entry_points(group=KINDS[kind].group)}  # e.g. examples/plugin, installed
    others = set(registry(kind).names()) - set(KINDS[kind].builtins) - plugins  # registered at run time
    by_trinity = {name for name in others if getattr(registry(kind).get(name), "__module__", "").startswith("trinity.")}
    assert by_trinity == set()  # Trinity's own code registers nothing the table lacks


def test_builtin_modules_are_imported_on_first_lookup_not_before():
    script = (
        "import sys\n"
        "from trinity.explorer.rewards import REWARDS\n"
        "assert 'trinity.explorer.rewards.countdown' not in sys.modules\n"
        "assert 'countdown' in REWARDS\n"
        "assert 'trinity.explorer.rewards.countdown' not in sys.modules\n"
        "REWARDS.get('countdown')\n"
        "assert 'trinity.explorer.rewards.countdown' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


# --- config choices and registries agree ----------------------------------------------------------


def test_config_validates_every_builtin_name_it_checks():
    for kind in ("algorithm", "workflow", "reward", "operator", "selector", "engine", "loss_agg_mode"):
        for name in KINDS[kind].builtins:
            assert check_name(kind, name) == name


def test_fixed_config_choices_are_the_registered_names():
    # Choices that select a config shape or a gateway negotiation stay literals; they must still be the
    # registries' names.
    assert _union_tags(TrainerConfig) == set(KINDS["trainer_backend"].builtins)
    assert set(get_args(OptimizerSection.model_fields["schedule"].annotation)) == set(KINDS["lr_schedule"].builtins)
    assert set(get_args(SyncMethod)) == {"auto", *KINDS["sync_backend"].builtins}
    assert set(get_args(SyncBackend)) == set(KINDS["sync_backend"].builtins)
    assert set(get_args(ChecksumName)) == set(KINDS["checksum"].builtins)
    # `scripted` replies from a Python function, so no config can select it
    assert set(get_args(ExplorerConfig.model_fields["engine"].annotation)) == set(KINDS["engine"].builtins) - {
        "scripted"
    }


def test_every_builtin_workflow_has_an_options_shape():
    assert set(WORKFLOW_OPTIONS) == set(KINDS["workflow"].builtins)


def test_operators_a_preset_requires_are_registered():
    presets = registry("algorithm")
    for name in KINDS["algorithm"].builtins:
        for operator in presets.get(name).operators:
            assert operator in KINDS["operator"].builtins, (name, operator)


def _union_tags(annotation: Any) -> set[str]:
    """The `Tag` of each arm of a discriminated union `Annotated[Annotated[X, Tag(t)] | ..., Discriminator]`."""
    union = get_args(annotation)[0]
    return {meta.tag for arm in get_args(union) for meta in get_args(arm)[1:] if hasattr(meta, "tag")}


# --- names checked when a config is parsed --------------------------------------------------------


def _config(**sections: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load(QUICKSTART.read_text())
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"algorithm": {"algorithm_type": "grpoo"}}, "algorithm.algorithm_type: unknown 'grpoo'; known: asymre, "),
        ({"explorer": {"workflow": "mathh"}}, "explorer.workflow: unknown 'mathh'; known: agentscope, countdown, "),
        (
            {"explorer": {"workflow": "multi_turn", "workflow_options": {"environment": "guess_numbr"}}},
            "explorer.workflow_options: environment: unknown 'guess_numbr'; known: guess_number ",
        ),
        (
            {"algorithm": {"policy_loss": {"loss_agg_mode": "sum"}}},
            "algorithm.policy_loss: loss_agg_mode: unknown 'sum'; known: pair-mean, seq-mean-token-mean, ",
        ),
    ],
)
def test_an_unknown_name_fails_naming_the_field_and_the_known_names(sections, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        parse_run_config(yaml.safe_dump(_config(**sections)))


def test_unknown_names_in_task_sets_and_streams_name_their_field():
    data = _config()
    data["buffer"]["taskset"] |= {"reward_fn": "composite:accuracy=0.9,fromat=0.1", "selector": "hardest"}
    data["buffer"]["experience_stream"] = {"operators": [{"name": "reward_filterr"}]}
    with pytest.raises(ValueError) as err:
        parse_run_config(yaml.safe_dump(data))
    lines = str(err.value).splitlines()
    assert "buffer.taskset.selector: unknown 'hardest'; known: difficulty, random, sequential, shuffle" in lines
    assert any(line.startswith("buffer.taskset.reward_fn: unknown 'fromat'; known: accuracy") for line in lines)
    assert any(line.startswith("buffer.experience_stream.operators.0.name: unknown 'reward_filterr'") for line in lines)


def test_validating_a_config_takes_well_under_a_second(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(QUICKSTART.read_text())
    start = time.perf_counter()
    load_run_config(path)
    assert time.perf_counter() - start < 0.5


def test_validating_a_config_imports_no_service_code_and_no_torch():
    # The gateway image validates configs with trinity-common alone.
    script = (
        "import sys\n"
        "from trinity.config import load_run_config\n"
        f"load_run_config({str(QUICKSTART)!r})\n"
        "prefixes = ('torch', 'trinity.algorithms', 'trinity.buffer', 'trinity.explorer', 'trinity.trainer')\n"
        "print(sorted(m for m in sys.modules if m.startswith(prefixes)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"


def test_an_unknown_workflow_is_exit_2_naming_the_field_before_anything_starts(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(explorer={"workflow": "no_such_workflow"})))
    output = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    known = "agentscope, countdown, frozen_lake, math"
    assert f"explorer.workflow: unknown 'no_such_workflow'; known: {known}" in done.stderr
    assert not output.exists()  # no Redis, no service, no run directory


# --- the registry itself (fresh local registries: the global ones stay untouched) -----------------


def test_a_name_is_registered_once():
    things: Registry[int] = Registry("thing")
    things.register("one")(1)
    with pytest.raises(DuplicateNameError, match="'one' is already registered"):
        things.register("one")(2)
    assert things.get("one") == 1


def test_an_unknown_name_lists_the_known_ones():
    things: Registry[int] = Registry("thing")
    things.register("one")(1)
    things.register("two")(2)
    with pytest.raises(UnknownNameError, match=r"^unknown thing 'three'; known: one, two$") as err:
        things.get("three")
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)


def test_a_table_module_that_does_not_register_its_name_is_reported():
    things: Registry[int] = Registry("thing", builtins={"one": "json"})
    assert things.names() == ["one"]
    with pytest.raises(LookupError, match="module 'json' was loaded for thing 'one' but did not register it"):
        things.get("one")


def test_check_name_accepts_the_extra_names_a_field_allows():
    assert check_name("selector", "difficulty", also=("difficulty",)) == "difficulty"
    with pytest.raises(ValueError, match=r"^unknown 'difficulty'; known: random, sequential, shuffle$"):
        check_name("selector", "difficulty")
