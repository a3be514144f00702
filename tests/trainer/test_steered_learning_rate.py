"""A steered learning rate (the Steer RPC): the torch backend's next update uses it, its schedule continues from
it, and a checkpoint keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import random_rollouts, run_config

from trinity.trainer.torch_backend import TorchBackend


def test_the_next_train_step_reports_the_steered_rate(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, optimizer={"lr": 1e-3}))
    assert backend.train_step(random_rollouts(4))["lr"] == pytest.approx(1e-3)
    backend.set_learning_rate(4e-3)
    assert backend.learning_rate == pytest.approx(4e-3)
    assert backend.train_step(random_rollouts(4, seed=1))["lr"] == pytest.approx(4e-3)


def test_a_warmup_schedule_continues_from_the_steered_base(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, optimizer={"lr": 1e-3, "schedule": "warmup", "warmup_steps": 4}))
    backend.train_step(random_rollouts(4))  # update 0 at 1/4 of the base
    backend.set_learning_rate(2e-3)
    assert backend.train_step(random_rollouts(4, seed=1))["lr"] == pytest.approx(2e-3 * 2 / 4)


def test_a_checkpoint_keeps_the_steered_rate(tiny_model: Path, tmp_path: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, optimizer={"lr": 1e-3}), tmp_path)
    backend.train_step(random_rollouts(4))
    backend.set_learning_rate(3e-3)
    path = backend.save_checkpoint()
    restored = TorchBackend(run_config(tiny_model, optimizer={"lr": 1e-3}), tmp_path)
    restored.load_checkpoint(path)
    assert restored.learning_rate == pytest.approx(3e-3)


def test_a_megatron_trainer_refuses_a_learning_rate_with_failed_precondition(tiny_model: Path) -> None:
    import grpc

    from trinity.runtime.client import open_channel
    from trinity.runtime.server import start_grpc_service
    from trinity.runtime.settings import ServiceSettings
    from trinity.trainer.megatron.backend import MegatronBackend
    from trinity.trainer.runner import TrainerRunner
    from trinity.trainer.server import SERVICE_NAME, TrainerServicer
    from trinity.v1 import common_pb2, trainer_pb2_grpc

    settings = ServiceSettings(service="trainer", host="127.0.0.1")
    servicer = TrainerServicer(settings)
    server = start_grpc_service(settings, servicer, trainer_pb2_grpc.add_TrainerServiceServicer_to_server, SERVICE_NAME)
    try:
        # A runner training with the Megatron backend; its optimizer lives in workers this test need not start,
        # since the backend refuses before it would reach them.
        nowhere = "127.0.0.1:1"  # no call reaches the buffer or the gateway
        runner = TrainerRunner(run_id="r", stage=0, config=run_config(tiny_model), instance_id="t",
                               buffer_address=nowhere, gateway_address=nowhere, advertise_host="127.0.0.1")  # fmt: skip
        runner.backend, runner.state = MegatronBackend.__new__(MegatronBackend), "running"
        servicer.host.runner = runner
        request = common_pb2.SteerRequest(run_id="r", steering=common_pb2.Steering(learning_rate=1e-4))
        with open_channel(f"127.0.0.1:{server.port}") as channel, pytest.raises(grpc.RpcError) as err:
            trainer_pb2_grpc.TrainerServiceStub(channel).Steer(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "trainer.backend megatron" in err.value.details()
    finally:
        server.stop(grace=0)
