"""A follower rank (1..N-1) of a data-parallel trainer: `trinity-trainer-rank` or
`python -m trinity.trainer.ranks.follower`.

It reads the torchrun environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `LOCAL_RANK`), joins
the run rank 0 announces at `MASTER_ADDR:MASTER_PORT`, builds its backend from the run config it receives
and runs rank 0's commands until the run ends. In a deployment with a token it proves membership with the run's
rank secret: a local follower gets it from rank 0 (`TRINITY_RANK_SECRET`), one on another host from the gateway
(`TRINITY_GATEWAY`, with its `TRINITY_AUTH_TOKEN`). With `--once` (how the leader starts its local followers) it
then exits; without, it waits for the next run (persistent followers on other hosts), each wait bounded by
`--join-timeout`. A failure is reported to rank 0 (the traceback, in the store) and ends the process, which
closes its sockets so that no rank waits on it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from trinity.clients.gateway import GatewayClient
from trinity.config import RunConfig, TorchTrainerConfig
from trinity.runtime.errors import one_line
from trinity.runtime.logging import configure_logging, get_logger
from trinity.runtime.settings import auth_token
from trinity.runtime.tls import TlsSettings
from trinity.trainer.backend import build_backend
from trinity.trainer.ranks import rendezvous
from trinity.trainer.ranks.commands import END, run_command
from trinity.trainer.ranks.processes import PARENT_PID_ENV, SECRET_ENV, THREADS_ENV, die_with_parent

log = get_logger(__name__)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int

    @classmethod
    def from_environ(cls) -> RankEnv:
        def number(name: str, default: str | None = None) -> int:
            value = os.environ.get(name, default)
            if value is None:
                raise ValueError(f"{name} is not set; a trainer rank reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not an integer") from None

        env = cls(
            rank=number("RANK"),
            world_size=number("WORLD_SIZE"),
            master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=number("MASTER_PORT"),
            local_rank=number("LOCAL_RANK", "0"),
        )
        if not 0 < env.rank < env.world_size:
            raise ValueError(
                f"RANK={env.rank}: a follower is rank 1..WORLD_SIZE-1 ({env.world_size - 1}); 0 is the trainer"
            )
        return env


def rank_secret(announcement: rendezvous.Announcement) -> bytes | None:
    """The run's rank secret: rank 0's (a local follower), else the gateway's for this rank's token; None without a
    token, as rank 0 has none then."""
    if given := os.environ.pop(SECRET_ENV, ""):  # popped: none of this rank's own children needs it
        return bytes.fromhex(given)
    token = auth_token()
    if token is None:
        if announcement.authenticated:
            raise ValueError(
                "the trainer's ranks prove membership with the run's secret: set TRINITY_AUTH_TOKEN and "
                "TRINITY_GATEWAY on this rank, so that it can ask the gateway for it"
            )
        return None
    gateway = os.environ.get("TRINITY_GATEWAY")
    if not gateway:
        raise ValueError("TRINITY_AUTH_TOKEN is set: set TRINITY_GATEWAY too, to fetch the run's rank secret")
    with GatewayClient(gateway, token=token, tls=TlsSettings.from_env()) as client:
        return client.rank_secret(announcement.run_id)


def serve_run(env: RankEnv, store: dist.Store, announcement: rendezvous.Announcement) -> None:
    """One run: build the backend, run commands until `end`. Any failure is reported and ends the process."""
    try:
        config = RunConfig.model_validate_json(announcement.config_json)
        trainer = config.trainer
        if not isinstance(trainer, TorchTrainerConfig) or trainer.data_parallel_size != env.world_size:
            size = getattr(trainer, "data_parallel_size", None)
            raise ValueError(f"WORLD_SIZE={env.world_size} but the run's trainer.data_parallel_size is {size}")
        secret = rank_secret(announcement)
        if store.add(f"joined/{env.rank}", 1) != 1:
            raise ValueError(f"RANK={env.rank} joined twice: give every follower its own RANK")
        log.info("rank.joined", run_id=announcement.run_id, rank=env.rank, world_size=env.world_size)
        if torch.cuda.is_available():
            torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        groups = rendezvous.init_groups(store, env.rank, env.world_size, trainer, announcement, secret)
        ckpt = Path(announcement.checkpoint_dir) if announcement.checkpoint_dir is not None else None
        backend = build_backend(config, ckpt)
        store.set(f"ready/{env.rank}", "1")
        while True:
            method, args = rendezvous.receive_command(groups)
            result = None if method == END else run_command(backend, method, args)
            dist.gather_object(result, None, dst=0, group=groups.replies)
            if method == END:
                break
        del backend
        dist.destroy_process_group()
        log.info("rank.run_ended", run_id=announcement.run_id, rank=env.rank)
    except BaseException as err:  # noqa: BLE001 (whatever it is, rank 0 must hear of it before this process ends)
        with contextlib.suppress(Exception):  # rank 0 may be gone; its own error then tells
            store.set(f"error/{env.rank}", traceback.format_exc())
        log.error("rank.failed", run_id=announcement.run_id, rank=env.rank, error=one_line(err))
        sys.stderr.flush()
        os._exit(1)  # at once: no rank may wait on this one in a collective


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trinity-trainer-rank", description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="serve one run, then exit (a leader's local rank)")
    parser.add_argument(
        "--join-timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for a run to be announced before giving up (exit 1; a supervisor restarts it)",
    )
    args = parser.parse_args(argv)
    configure_logging("trainer-rank")
    if PARENT_PID_ENV in os.environ:
        die_with_parent(int(os.environ[PARENT_PID_ENV]))
    try:
        env = RankEnv.from_environ()
    except ValueError as err:
        log.error("rank.bad_environment", error=str(err))
        return 2
    if threads := int(os.environ.get(THREADS_ENV, "0")):
        torch.set_num_threads(threads)
    previous: str | None = None
    while True:
        log.info("rank.waiting_for_run", rank=env.rank, address=f"{env.master_addr}:{env.master_port}",
                 timeout_s=args.join_timeout)  # fmt: skip
        try:
            store, announcement = rendezvous.join_run(env.master_addr, env.master_port, args.join_timeout, previous)
        except rendezvous.JoinTimeout as err:
            log.error("rank.no_run", rank=env.rank, error=str(err))
            return 1
        previous = announcement.token
        serve_run(env, store, announcement)
        del store
        if args.once:
            return 0


if __name__ == "__main__":
    sys.exit(main())
