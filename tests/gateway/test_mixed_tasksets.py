"""A run with several train task sets: the gateway creates each set and their mixture in the buffer, per stage."""

from __future__ import annotations

import pytest
import yaml

from tests.gateway.run_harness import EXAMPLES, Gateway
from trinity.clients import BufferClient
from trinity.config import naming
from trinity.v1 import gateway_pb2


@pytest.fixture
def gateway(harness: Gateway) -> Gateway:
    return harness


def test_a_run_of_several_task_sets_leases_from_their_mixture_with_the_configs_weights(gateway, buffer_service, unique):
    train = {"path": str(EXAMPLES / "train.jsonl"), "prompt_key": "question", "answer_key": "answer"}
    config = {
        "mode": "both",
        "model": {"path": "base-model"},
        "buffer": {
            "batch_size": 2,
            "total_steps": 2,
            "tasksets": [{**train, "name": "easy", "weight": 3}, {**train, "name": "hard", "epochs": 2}],
            "mixing": {"seed": 5},
        },
    }
    run = gateway.orchestrator.create_run(yaml.safe_dump(config), run_id=unique)
    gateway.orchestrator.stages.launch(run.id)
    assert gateway.run(run.id).state == gateway_pb2.RUN_STATE_RUNNING, gateway.run(run.id).error
    with BufferClient(buffer_service.address) as buffer:
        mixture = buffer.mixture(naming.mixture(unique, 0))
        easy, hard = naming.taskset(unique, 0, "easy"), naming.taskset(unique, 0, "hard")
        assert [(m.taskset, m.weight if m.HasField("weight") else None) for m in mixture.spec.members] == [
            (easy, 3.0),
            (hard, None),
        ]
        assert list(mixture.shares) == [0.75, 0.25] and mixture.spec.mixing.seed == 5
        assert buffer.taskset(hard).total_tasks == 2 * buffer.taskset(easy).total_tasks
        tasks = buffer.lease_tasks(naming.train_tasks(unique, 0, ["easy", "hard"]), "explorer", 4).tasks
        assert {t.taskset for t in tasks} <= {easy, hard} and len(tasks) == 4
