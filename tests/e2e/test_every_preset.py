"""Every online algorithm preset trains through the real services: one local stack (Redis, gateway, buffer,
trainer, a vLLM explorer) started once, then one small run per preset submitted through the SDK.

Each run is 2 synchronous steps of 2 tasks x 4 samples on a tiny random model, with rewards that vary
within groups (tests/e2e/presets.py): the preset's advantage, loss, KL and required parts all run, and
the weights the explorer serves must change at every step. Presets added to the library join the list.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.presets import online_presets, preset_run_config, write_mixed_reward_tasks
from trinity.cli.launcher import LocalStack
from trinity.models.tiny import build_tiny_llama
from trinity.runtime.client import open_channel
from trinity.runtime.run_host import ACTIVE
from trinity.sdk import TrinityClient
from trinity.sdk.metrics import RunMetrics
from trinity.v1 import common_pb2, explorer_pb2_grpc, gateway_pb2, trainer_pb2_grpc

pytestmark = pytest.mark.system  # `make test-system`: its own target keeps `make test` under 20 minutes

STEPS = 2
RUN_TIMEOUT_S = 300.0
IDLE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    stack = LocalStack.up(tmp_path_factory.mktemp("presets") / "logs", explorers=1)
    yield stack
    stack.down()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return write_mixed_reward_tasks(tmp_path_factory.mktemp("preset-tasks") / "tasks.jsonl")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    # The student's shape and vocabulary with other weights: distillation has something to move toward.
    return build_tiny_llama(
        tmp_path_factory.mktemp("teacher") / "tiny",
        vocab_size=320,
        hidden_size=128,
        intermediate_size=256,
        num_heads=2,
        num_kv_heads=1,
        seed=1,
    )


def _service_logs(stack: LocalStack) -> str:
    return "\n".join(f"--- {name}\n{handle.log_path.read_text()[-1500:]}" for name, handle in stack.services.items())


def _wait_until_idle(stack: LocalStack) -> None:
    """The trainer and explorer hold no run: a run that failed and is still stopping must not fail the next one."""
    stubs = {"trainer": trainer_pb2_grpc.TrainerServiceStub, "explorer-0": explorer_pb2_grpc.ExplorerServiceStub}
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    for name, stub in stubs.items():
        with open_channel(stack.services[name].address) as channel:
            while (status := stub(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)).state in ACTIVE:
                assert time.monotonic() < deadline, f"{name} still holds run {status.run_id} ({status.state})"
                time.sleep(0.2)  # polls a state no event announces; bounded by the deadline


def _run_preset(stack: LocalStack, config: dict) -> tuple[gateway_pb2.Run, RunMetrics]:
    _wait_until_idle(stack)
    with TrinityClient(stack.gateway) as client:
        handle = client.create_run(config)
        run = handle.wait(timeout=RUN_TIMEOUT_S)
        return run, handle.metrics()


@pytest.mark.parametrize("preset", online_presets())
def test_the_preset_trains_every_step_through_the_services(stack, tiny_model, teacher, tasks, tmp_path, preset):
    config = preset_run_config(preset, tiny_model, tasks, tmp_path / "checkpoints", teacher=teacher, steps=STEPS)
    run, metrics = _run_preset(stack, config)
    assert run.state == gateway_pb2.RUN_STATE_SUCCEEDED, f"{run.error}\n{_service_logs(stack)}"
    assert [row["step"] for row in metrics.train] == [float(s) for s in range(1, STEPS + 1)]
    for row in metrics.train:
        assert math.isfinite(row["loss/total"]), row
    published = [row["weights_digest"] for row in metrics.train]
    assert len(set(published)) == STEPS, "the weights did not change at every step"
    served = {row["model_version"]: row["weights_digest"] for row in metrics.weights if "weights_digest" in row}
    assert served == {float(s): published[s - 1] for s in range(1, STEPS + 1)}  # the explorer got each version


def test_the_tasks_give_the_tiny_model_mixed_rewards(stack, tiny_model, tasks, tmp_path):
    """The premise of the runs above: the tiny model's responses score neither all 0 nor all 1."""
    run, metrics = _run_preset(stack, preset_run_config("grpo", tiny_model, tasks, tmp_path / "checkpoints", steps=1))
    assert run.state == gateway_pb2.RUN_STATE_SUCCEEDED, run.error
    (explored,) = metrics.explore
    assert 0.2 < explored["reward_mean"] < 0.8 and explored["reward_std"] > 0
