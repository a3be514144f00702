"""The ranks of a data-parallel trainer: real follower processes, real gloo, the tiny model, on the CPU.

Until the FSDP core lands, a `TorchBackend` on N ranks trains N identical full replicas (same seed, same
whole batch), so replicas that kept in step have equal weights.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch.distributed as dist
from pydantic import ValidationError
from trainer_helpers import grouped_rollouts, run_config

from tests.conftest import ServiceProcess
from tests.e2e.conftest import tiny_config
from trinity.clients import GatewayClient
from trinity.config import RunConfig
from trinity.runtime.redis_server import free_port
from trinity.sdk import TrinityClient
from trinity.trainer.ranks import RankFailure, ReplicatedBackend
from trinity.trainer.ranks.follower import RankEnv
from trinity.trainer.ranks.processes import SECRET_ENV

# Bounds, not expectations: every wait below ends on an event long before these.
_LIMITS = {"start_timeout_s": 120.0, "command_timeout_s": 120.0, "collective_timeout_s": 120.0}


@pytest.fixture(autouse=True)
def no_default_group_left_by_other_tests() -> None:
    """In the whole suite, the explorer tests build vLLM engines in this process, and vLLM initialises
    torch.distributed's default group even for one process; a trainer process (rank 0) owns that group, so it
    must not exist when a test plays the trainer."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _config(model: Path, **trainer: Any) -> RunConfig:
    return run_config(model, "grpo", total_steps=4, data_parallel_size=2, **{**_LIMITS, **trainer})


@pytest.fixture
def remote_follower() -> Iterator[Any]:
    """Start a follower as another host would (its own environment, not the leader's child); stopped after.
    `secret`: the run's rank secret handed to it (as a leader does to its local followers); `env`: more variables;
    `log`: a file for its output."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        port: int,
        *args: str,
        world_size: int = 2,
        secret: bytes | None = None,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        unrelated = ("TRINITY_AUTH_TOKEN", "TRINITY_GATEWAY", SECRET_ENV)  # only what the test gives it
        environment = {name: value for name, value in os.environ.items() if name not in unrelated}
        environment.update({"RANK": "1", "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0"})
        environment.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TRINITY_TRAINER_THREADS": "1"})
        environment.update({SECRET_ENV: secret.hex()} if secret is not None else {})
        environment.update(env or {})
        cmd = [sys.executable, "-m", "trinity.trainer.ranks.follower", "--join-timeout", "120", *args]
        output = log.open("wb") if log is not None else None
        procs.append(subprocess.Popen(cmd, env=environment, stdout=output, stderr=subprocess.STDOUT if log else None))
        return procs[-1]

    yield start
    for p in procs:
        p.kill()
        p.wait(10)


def test_two_ranks_train_in_step_even_after_an_abandoned_weights_stream(tiny_model: Path) -> None:
    backend = ReplicatedBackend(_config(tiny_model), None, run_id="dp2")
    try:
        before = backend.rank_states()
        backend.train_step(grouped_rollouts(2, 4, seed=1))
        stream = backend.named_weights()
        next(stream)  # a consumer that stops early: every rank must still finish the stream
        del stream
        backend.train_step(grouped_rollouts(2, 4, seed=2))
        after = backend.rank_states()
    finally:
        backend.close()
    assert (backend.step, backend.model_version) == (2, 2)  # still reported after the run
    assert [s["step"] for s in after] == [2, 2]
    assert [s["model_version"] for s in after] == [2, 2]
    assert after[1]["weights_digest"] == after[0]["weights_digest"]
    assert before[1]["weights_digest"] == before[0]["weights_digest"] != after[0]["weights_digest"]
    assert not dist.is_initialized()  # destroyed with the run: the trainer can train another
    assert backend.local_followers.exited() == {1: 0}  # `--once`: the follower left when the run ended


def test_a_killed_follower_fails_the_next_call_quickly_naming_rank_and_exit_code(tiny_model: Path) -> None:
    backend = ReplicatedBackend(_config(tiny_model), None, run_id="dp2-kill")
    try:
        backend.train_step(grouped_rollouts(2, 4, seed=1))
        os.kill(backend.local_followers.pid(1), signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RankFailure) as failure:
            backend.train_step(grouped_rollouts(2, 4, seed=2))
        seconds = time.monotonic() - started
        with pytest.raises(RankFailure, match="were stopped"):
            backend.train_step(grouped_rollouts(2, 4, seed=3))
    finally:
        backend.close()
    assert failure.value.ranks == {1: "exit code -9 (SIGKILL)"}
    assert seconds < _LIMITS["collective_timeout_s"] / 4  # noticed, not timed out
    assert not dist.is_initialized()


def test_a_follower_that_never_comes_fails_the_start_naming_rank_and_address(tiny_model: Path) -> None:
    config = _config(tiny_model, local_ranks=1, start_timeout_s=1.0)  # rank 1 belongs to another host
    with pytest.raises(RankFailure, match=r"rank\(s\) \[1\] did not join at 127\.0\.0\.1:\d+ within 1s") as failure:
        ReplicatedBackend(config, None, run_id="alone")
    assert failure.value.ranks == {1: "did not join"}
    assert not dist.is_initialized()


def test_a_follower_error_reaches_the_leader_with_its_traceback(tiny_model: Path, remote_follower: Any) -> None:
    port = free_port()
    follower = remote_follower(port, "--once", world_size=3)  # the run has 2 ranks
    with pytest.raises(RankFailure) as failure:
        ReplicatedBackend(_config(tiny_model, local_ranks=1, master_port=port), None, run_id="mismatch")
    report = failure.value.ranks[1]
    assert "Traceback" in report
    assert "WORLD_SIZE=3 but the run's trainer.data_parallel_size is 2" in report
    assert follower.wait(60) == 1


def test_a_persistent_follower_serves_one_run_after_another(tiny_model: Path, remote_follower: Any) -> None:
    port = free_port()
    follower = remote_follower(port)  # no --once: it waits for the next run
    steps = []
    for run in range(2):
        backend = ReplicatedBackend(_config(tiny_model, local_ranks=1, master_port=port), None, run_id=f"r{run}")
        try:
            backend.train_step(grouped_rollouts(2, 4, seed=run))
            steps.append([s["step"] for s in backend.rank_states()])
        finally:
            backend.close()
        assert follower.poll() is None
    assert steps == [[1, 1], [1, 1]]  # each run starts afresh on both ranks


def test_a_follower_with_no_run_to_join_gives_up_after_its_join_timeout() -> None:
    port = free_port()  # nobody listens there
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, "-m", "trinity.trainer.ranks.follower", "--join-timeout", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"no trainer run announced at 127.0.0.1:{port} within 1s" in done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "RANK is not set"),
        ({"RANK": "one", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "RANK='one' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "RANK=0: a follower is rank 1..WORLD_SIZE-1"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_PORT is not set"),
    ],
)
def test_a_follower_names_the_rank_variable_that_is_missing_or_wrong(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        RankEnv.from_environ()


def test_more_local_ranks_than_ranks_is_refused(tiny_model: Path) -> None:
    with pytest.raises(ValidationError, match=r"trainer.local_ranks: 3 exceeds trainer.data_parallel_size \(2\)"):
        _config(tiny_model, local_ranks=3)


def test_a_steered_learning_rate_reaches_every_rank(tiny_model: Path) -> None:
    backend = ReplicatedBackend(_config(tiny_model), None, run_id="dp2-lr")
    try:
        backend.train_step(grouped_rollouts(2, 4, seed=1))
        steered = backend.learning_rate * 50
        backend.set_learning_rate(steered)
        metrics = backend.train_step(grouped_rollouts(2, 4, seed=2))
        states = backend.rank_states()
    finally:
        backend.close()
    assert metrics["lr"] == pytest.approx(steered)
    assert [s["learning_rate"] for s in states] == [pytest.approx(steered)] * 2
    assert states[1]["weights_digest"] == states[0]["weights_digest"]


@pytest.mark.system  # 20 s of waiting for a bound: kept out of `make test`'s budget
def test_a_hung_follower_fails_the_next_call_within_the_command_timeout_naming_it(tiny_model: Path) -> None:
    bound = 5.0
    backend = ReplicatedBackend(
        _config(tiny_model, command_timeout_s=bound, collective_timeout_s=bound), None, run_id="dp2-hang"
    )
    pid = backend.local_followers.pid(1)
    try:
        backend.train_step(grouped_rollouts(2, 4, seed=1))
        os.kill(pid, signal.SIGSTOP)  # alive, holding its sockets open, answering nothing
        started = time.monotonic()
        with pytest.raises(RankFailure) as failure:
            backend.train_step(grouped_rollouts(2, 4, seed=2))
        seconds = time.monotonic() - started
    finally:
        with contextlib.suppress(ProcessLookupError):  # the failure killed it (local followers are stopped)
            os.kill(pid, signal.SIGCONT)
        backend.close()
    assert failure.value.ranks == {1: "answered nothing within 5s (command_timeout_s)"}
    assert "train_step failed on the trainer ranks" in str(failure.value)
    assert seconds < 4 * bound  # bounded: the stopped rank would otherwise hold rank 0 forever
    assert not dist.is_initialized()


# ---- no stranger among the ranks: the run's secret (a deployment with a token) ------------------------------------


@pytest.mark.parametrize("secret", [secrets.token_bytes(32), None], ids=["a wrong secret", "no secret"])
def test_a_follower_without_the_run_secret_is_refused_and_the_next_run_forms(
    tiny_model: Path, remote_follower: Any, tmp_path: Path, secret: bytes | None
) -> None:
    port, run_secret, log = free_port(), secrets.token_bytes(32), tmp_path / "rank1.log"
    follower = remote_follower(port, "--once", secret=secret, log=log)
    config = _config(tiny_model, local_ranks=1, master_port=port)
    with pytest.raises(RankFailure) as failure:
        ReplicatedBackend(config, None, run_id="stranger", secret=run_secret)
    assert follower.wait(60) == 1
    assert not dist.is_initialized()
    if secret is not None:
        assert failure.value.ranks == {1: "refused: it did not prove it holds the run's rank secret"}
        assert "claiming rank 1, that fails authentication" in str(failure.value)
        assert "claiming rank 0, that fails authentication" in log.read_text()  # it refused rank 0 as well
    else:
        assert "set TRINITY_AUTH_TOKEN and TRINITY_GATEWAY on this rank" in failure.value.ranks[1]

    backend = ReplicatedBackend(_config(tiny_model), None, run_id="members", secret=run_secret)  # local follower
    try:
        backend.train_step(grouped_rollouts(2, 4, seed=1))
        states = backend.rank_states()
    finally:
        backend.close()
    assert states[1]["weights_digest"] == states[0]["weights_digest"]


def test_a_remote_follower_gets_the_run_secret_from_the_gateway_with_its_token(
    tiny_model: Path, remote_follower: Any, redis_server: Any, tmp_path: Path
) -> None:
    token = secrets.token_hex(16)
    gateway = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis_server.url, "TRINITY_AUTH_TOKEN": token})
    gateway.start()
    try:
        with TrinityClient(gateway.address, token=token) as client:
            run_id = client.create_run(tiny_config(tmp_path / "model")).id
        with GatewayClient(gateway.address, token=token) as client:
            secret = client.rank_secret(run_id)
            assert secret is not None and len(secret) == 32 and client.rank_secret(run_id) == secret
            with pytest.raises(grpc.RpcError) as unknown:
                client.rank_secret("no-such-run")  # no secret is made for a run that does not exist
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        port = free_port()
        remote_follower(port, "--once", env={"TRINITY_AUTH_TOKEN": token, "TRINITY_GATEWAY": gateway.address})
        backend = ReplicatedBackend(
            _config(tiny_model, local_ranks=1, master_port=port), None, run_id=run_id, secret=secret
        )
        try:
            backend.train_step(grouped_rollouts(2, 4, seed=1))
            states = backend.rank_states()
        finally:
            backend.close()
    finally:
        gateway.stop()
    assert [s["step"] for s in states] == [1, 1]
    assert states[1]["weights_digest"] == states[0]["weights_digest"]


def _spray_garbage(port: int, connections: int) -> list[socket.socket]:
    """Random bytes on `connections` connections to the port once it listens; the sockets, still open."""
    rng = random.Random(0)
    opened: list[socket.socket] = []
    deadline = time.monotonic() + 60
    while len(opened) < connections:
        try:
            connection = socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listened on port {port}"
            time.sleep(0.05)  # rank 0 has not bound its store yet
            continue
        connection.sendall(rng.randbytes(rng.randrange(1, 4096)))
        opened.append(connection)
    return opened


def test_garbage_on_the_rendezvous_port_while_the_ranks_form_does_not_break_them(
    tiny_model: Path, remote_follower: Any
) -> None:
    port, secret = free_port(), secrets.token_bytes(32)
    formed: dict[str, Any] = {}

    def lead() -> None:
        config = _config(tiny_model, local_ranks=1, master_port=port)
        try:
            formed["backend"] = ReplicatedBackend(config, None, run_id="garbage", secret=secret)
        except Exception as err:  # noqa: BLE001 - reported below
            formed["error"] = err

    leader = threading.Thread(target=lead)
    leader.start()
    garbage = _spray_garbage(port, 40)  # rank 0 waits for rank 1, which starts only after this
    remote_follower(port, "--once", secret=secret)
    leader.join()
    assert "error" not in formed, formed.get("error")
    backend = formed["backend"]
    try:
        backend.train_step(grouped_rollouts(2, 4, seed=1))
        states = backend.rank_states()
    finally:
        backend.close()
        for connection in garbage:
            connection.close()
    assert states[1]["weights_digest"] == states[0]["weights_digest"]
