"""The SDK against a live local stack: asyncio flavour end to end, direct generation, useful errors."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import tiny_config
from trinity.cli.launcher import LocalStack
from trinity.runtime.client import open_channel
from trinity.runtime.events import kind_name
from trinity.runtime.redis_server import free_port
from trinity.sdk import AsyncTrinityClient, GatewayUnavailable, InvalidRunConfig, RunNotFound, TrinityClient
from trinity.v1 import explorer_pb2, explorer_pb2_grpc, gateway_pb2


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = LocalStack.up(tmp_path_factory.mktemp("sdk") / "logs", explorers=1)
    yield stack
    stack.down()


def test_async_client_creates_watches_and_waits_for_a_run(stack, tiny_model):
    explorer = stack.services["explorer-0"].address

    async def scenario() -> tuple[gateway_pb2.Run, list[str], explorer_pb2.GenerateResponse]:
        async with AsyncTrinityClient(stack.gateway) as client:
            run = await client.create_run(tiny_config(tiny_model, **{"buffer.total_steps": 2}))
            kinds: list[str] = []  # as the console and the trackers name them
            generated = None
            async for event in run.watch():
                kinds.append(kind_name(event.kind))
                if event.kind == gateway_pb2.EVENT_KIND_EXPLORE and generated is None:
                    # while the run explores, the explorer also answers direct generation
                    with open_channel(explorer) as channel:
                        generated = explorer_pb2_grpc.ExplorerServiceStub(channel).Generate(
                            explorer_pb2.GenerateRequest(prompt="What is 1+1?", n=2, max_tokens=4, temperature=1.0),
                            timeout=60,
                        )
            final = await run.wait(timeout=60)
            assert run.id in [r.id for r in await client.list_runs()]
            return final, kinds, generated

    final, kinds, generated = asyncio.run(scenario())
    assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED
    assert {"train", "explore", "eval", "weights", "state"} <= set(kinds)
    assert kinds[-1] == "state"  # the stream ends with the final state
    assert len(generated.samples) == 2 and all(len(s.token_ids) == len(s.logprobs) for s in generated.samples)
    assert all(1 <= len(s.token_ids) <= 4 for s in generated.samples)


def test_a_bad_config_is_refused_with_the_field(stack, tiny_model):
    with TrinityClient(stack.gateway) as client, pytest.raises(InvalidRunConfig) as info:
        client.create_run(tiny_config(tiny_model, **{"explorer.temperature": -1}))
    assert "explorer.temperature" in str(info.value)


def test_a_mistyped_algorithm_override_is_refused_naming_it(stack, tiny_model):
    with TrinityClient(stack.gateway) as client, pytest.raises(InvalidRunConfig) as info:
        client.create_run(tiny_config(tiny_model, **{"algorithm.policy_loss": {"clip_rnage": 0.3}}))
    assert "algorithm.policy_loss: policy loss 'ppo' has no hyperparameter 'clip_rnage'" in str(info.value)


def test_an_unknown_run_is_run_not_found(stack):
    with TrinityClient(stack.gateway) as client, pytest.raises(RunNotFound):
        client.run("no-such-run")


def test_metrics_of_a_finished_run_are_read_from_its_event_log(stack, tiny_model):
    with TrinityClient(stack.gateway) as client:
        run = client.create_run(tiny_config(tiny_model, **{"buffer.total_steps": 1}))
        assert run.wait(timeout=120).state == gateway_pb2.RUN_STATE_SUCCEEDED
        metrics = run.metrics()
    assert [row["step"] for row in metrics.train] == [1.0]
    assert metrics.series(gateway_pb2.EVENT_KIND_EVAL, "accuracy")[0][0] == 0.0  # the first evaluation is of version 0


def test_no_gateway_is_gateway_unavailable():
    with TrinityClient(f"127.0.0.1:{free_port()}", timeout=2) as client, pytest.raises(GatewayUnavailable):
        client.list_runs()
