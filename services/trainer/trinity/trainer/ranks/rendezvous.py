"""How the ranks of one run find each other: a TCPStore on rank 0, the run announced in it, the groups.

Rank 0 hosts the store at `master_addr:master_port` and writes the run's `Announcement` (config, checkpoint
directory, run id, a fresh token). A follower connects, reads it, and from then on uses only keys under the
token (`joined/<rank>`, `ready/<rank>`, `error/<rank>`), so a persistent follower can never mistake the store
of the run that just ended for the next one. Then every rank builds the same groups: the default process
group (the backend's collectives) and two gloo groups of the command loop.

With the run's rank secret (a deployment with a token: the gateway hands it out), the groups meet in a
`SignedStore` and every rank proves membership of each group before the first command: the commands are
pickles, so a stranger in the group could run code on any rank (trinity.sync.membership). The proof is bound to
the announcement the rank read, so a rewritten announcement fails it too.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trinity.config import TorchTrainerConfig
from trinity.sync.membership import SignedStore, allgather_exchange, prove_membership

RUN_KEY = "trinity/run"
NEXT_KEY = "trinity/after/"  # + a run's token: the run announced after it (what its persistent followers wait on)
# Followers wait for the next command for as long as the trainer waits for data: no timeout that matters.
IDLE_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True)
class Announcement:
    token: str
    run_id: str
    config_json: str  # the run config rank 0 builds its backend with (`model.path` a directory)
    checkpoint_dir: str | None
    # Rank 0 proves membership with the run's secret; a follower without one is told how to get it. A follower that
    # has a token asks the gateway whatever this says (anyone can rewrite it).
    authenticated: bool = False

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> Announcement:
        return cls(**json.loads(data))

    @property
    def group(self) -> str:
        """The ranks' name in membership proofs: the run and a digest of everything announced."""
        return f"trainer ranks of run {self.run_id} ({hashlib.sha256(self.encode().encode()).hexdigest()[:16]})"


@dataclass(frozen=True)
class Groups:
    commands: dist.ProcessGroup  # rank 0 broadcasts `(method, args)`; followers wait on it while idle
    replies: dist.ProcessGroup  # every rank's result, gathered to rank 0 within `command_timeout_s`


# One store per rendezvous address for the life of the trainer process, reused by each run (every run's keys
# are under its own token): a fixed `master_port` is then never rebound while a finished run's objects (or
# torch's caches of them) still hold the old store, and persistent followers always find it.
_hosted: dict[tuple[str, int | None], dist.TCPStore] = {}
_hosted_lock = threading.Lock()


def host_run(
    addr: str,
    port: int | None,
    run_id: str,
    config_json: str,
    checkpoint_dir: str | None,
    timeout_s: float,
    authenticated: bool = False,
) -> tuple[dist.PrefixStore, int, Announcement]:
    """Rank 0: announce a run in this process's store at `addr:port` (None = a free port); the store of the
    run's keys, the port and the announcement."""
    with _hosted_lock:
        store = _hosted.get((addr, port))
        if store is None:
            store = dist.TCPStore(addr, port or 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
            _hosted[(addr, port)] = store
    store.set_timeout(timedelta(seconds=timeout_s))
    token = uuid.uuid4().hex
    announcement = Announcement(token, run_id, config_json, checkpoint_dir, authenticated)
    if store.check([RUN_KEY]):
        store.set(NEXT_KEY + Announcement.decode(store.get(RUN_KEY)).token, announcement.encode())
    store.set(RUN_KEY, announcement.encode())
    return dist.PrefixStore(token, store), int(store.port), announcement


class JoinTimeout(TimeoutError):
    """No run was announced at the rendezvous address in time."""


def join_run(
    addr: str, port: int, timeout_s: float, previous_token: str | None
) -> tuple[dist.PrefixStore, Announcement]:
    """A follower: the next run announced at `addr:port` (not `previous_token`'s), within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            store = dist.TCPStore(addr, port, None, False, timedelta(seconds=left))
            announcement = Announcement.decode(store.get(RUN_KEY))
            if announcement.token == previous_token:  # the store of the run just served: wait for the next
                store.wait([NEXT_KEY + announcement.token], timedelta(seconds=max(0.001, deadline - time.monotonic())))
                announcement = Announcement.decode(store.get(NEXT_KEY + announcement.token))
        except dist.DistError:  # nobody listened in time, the store went away (a restarted trainer), or no run came
            time.sleep(0.5)
            continue
        return dist.PrefixStore(announcement.token, store), announcement
    raise JoinTimeout(f"no trainer run announced at {addr}:{port} within {timeout_s:.0f}s")


def init_groups(
    store: dist.Store,
    rank: int,
    world_size: int,
    trainer: TorchTrainerConfig,
    announcement: Announcement,
    secret: bytes | None,
) -> Groups:
    """The default process group and the command loop's groups, on every rank in the same order; with the run's
    secret, each proven (`MembershipRefused` naming the ranks that fail) before any command travels."""
    backend = trainer.distributed_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    groups_store = store if secret is None else SignedStore(store, secret, announcement.group, rank)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("pg", groups_store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=trainer.collective_timeout_s),
    )
    commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    replies = dist.new_group(backend="gloo", timeout=timedelta(seconds=trainer.command_timeout_s))
    if secret is not None:
        limit = timedelta(seconds=trainer.command_timeout_s)
        cpu = torch.device("cpu")
        default = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else cpu
        # A stranger may have taken a member's place in any of the three.
        for group, device in ((dist.group.WORLD, default), (commands, cpu), (replies, cpu)):
            prove_membership(allgather_exchange(group, world_size, device, limit), secret, announcement.group, rank)
    return Groups(commands, replies)


class CommandTimeout(RuntimeError):
    """Rank 0 could not hand a command to every follower in time: one is alive but answers nothing."""


def send_command(groups: Groups, command: tuple[str, tuple[Any, ...]], timeout_s: float) -> None:
    """Rank 0: `command` to every follower, within `timeout_s`. The commands group itself never times out
    (followers idle on it between steps), and gloo's broadcast waits for each receiver to be ready, so a follower
    that is alive but stuck (stopped, blocked in I/O) would hold rank 0 forever without this bound."""
    payload = pickle.dumps(command)
    limit = timedelta(seconds=timeout_s)
    for tensor in (torch.tensor([len(payload)], dtype=torch.int64), torch.frombuffer(payload, dtype=torch.uint8)):
        work = dist.broadcast(tensor, src=0, group=groups.commands, async_op=True)
        assert work is not None  # async_op=True always returns the work
        try:
            work.wait(limit)
        except RuntimeError as err:
            raise CommandTimeout(f"the command did not reach every rank within {timeout_s:g}s: {err}") from err


def receive_command(groups: Groups) -> tuple[str, tuple[Any, ...]]:
    """A follower: the next command rank 0 sends (waits as long as rank 0 is idle)."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=groups.commands)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=groups.commands)
    method, args = pickle.loads(data.numpy().tobytes())
    return method, args


def ranks_with(store: dist.Store, key: str, ranks: range) -> list[int]:
    return [r for r in ranks if store.check([f"{key}/{r}"])]
