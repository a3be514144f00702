"""A run over four test hosts (issue 14, item 5): the control plane on one, the trainer's rank 0 (the trainer
service) on a second, its follower rank 1 (`trinity-trainer-rank`, started from the torchrun environment as on
another machine) on a third, the explorer on a fourth. The ranks' process group and the weight-sync group are
gloo groups across hosts; the run trains to SUCCEEDED and every link's traffic shows on the hosts' veths. With a
token, as a deployment has: rank 1 fetches the run's rank secret from the gateway, and both groups prove membership."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.e2e.conftest import tiny_config
from tests.multihost.stack import REDIS_URL, host_env, start_redis, start_service
from trinity.sdk import RunMetrics, TrinityClient
from trinity.v1 import gateway_pb2

pytestmark = pytest.mark.system  # `make test-system`: its own target keeps `make test` under 20 minutes

MASTER_PORT = 29500
STEPS = 2


def _weight_bytes(model: Path) -> int:
    """The bytes of the model's tensors: what one published version carries."""
    return sum(t.nbytes for f in model.glob("*.safetensors") for t in load_file(str(f)).values())


def test_a_data_parallel_run_over_four_hosts_succeeds(network, tiny_model, tmp_path):
    net = network(["control", "rank0", "rank1", "explorer"])
    control, rank0, rank1, explorer = (net.hosts[label] for label in ("control", "rank0", "rank1", "explorer"))
    start_redis(control, tmp_path)
    token = secrets.token_hex(16)
    env = {"TRINITY_REDIS_URL": REDIS_URL, "TRINITY_AUTH_TOKEN": token}
    start_service(control, "gateway", tmp_path, env)
    gateway = f"{control.address}:50051"
    service = {"TRINITY_GATEWAY": gateway, "TRINITY_AUTH_TOKEN": token}
    start_service(control, "buffer", tmp_path, {**env, **service})
    follower_log = tmp_path / "rank1.log"
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": rank0.address}
    follower = rank1.popen(
        [sys.executable, "-m", "trinity.trainer.ranks.follower", "--once", "--join-timeout", "240"],
        env=host_env(rank1, {**torchrun, "MASTER_PORT": str(MASTER_PORT), **service}),  # the gateway: rank secret
        log=follower_log,
    )
    start_service(rank0, "trainer", tmp_path, service)
    start_service(explorer, "explorer", tmp_path, service)
    model_bytes = _weight_bytes(tiny_model)
    before = {host.label: host.veth_bytes() for host in (rank1, explorer)}

    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": STEPS,
            "buffer.eval_tasksets": [],
            "trainer.data_parallel_size": 2,
            "trainer.local_ranks": 1,  # rank 0 starts no follower itself: rank 1 is on its own host
            "trainer.master_addr": rank0.address,
            "trainer.master_port": MASTER_PORT,
            "checkpoint_dir": str(tmp_path / "runs"),
        },
    )
    with TrinityClient(gateway, token=token) as client:
        run = client.create_run(config)
        final = run.wait(timeout=240)
        metrics = RunMetrics.from_events(run.watch())
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error + logs

    assert [row["step"] for row in metrics.train] == [1.0, 2.0]
    published = {row["model_version"]: row["weights_digest"] for row in metrics.train}
    loaded = {row["model_version"]: row["weights_digest"] for row in metrics.weights if "weights_digest" in row}
    assert loaded == published, "the explorer serves other weights than the trainer published"
    # Rank 1 served the run to its end and left (--once) on its own.
    assert follower.wait(timeout=60) == 0, follower_log.read_text()[-3000:]
    # The ranks' collectives moved at least the weights between hosts once per step (sharded parameters are
    # gathered for every forward), and the explorer received every published version over its veth.
    assert rank1.veth_bytes() - before["rank1"] >= STEPS * model_bytes
    assert explorer.veth_bytes() - before["explorer"] >= STEPS * model_bytes
