"""Rank 0 of a data-parallel trainer: the trainer service's own process, driving followers 1..N-1.

`ReplicatedBackend` is a `TrainerBackend`: each call is broadcast as a command to the followers, run on the
local `TorchBackend` (built after the default process group exists, so it trains SPMD with the others),
and every rank's result is gathered before rank 0's is returned. Calls are serialized (the run's thread and
a `SaveCheckpoint` RPC may both call), so every rank sees the same commands in the same order.

Never hang: joining is bounded by `start_timeout_s`; a follower that raises reports its traceback in the
store and exits, and a follower that dies closes its sockets, so the leader's pending gloo operation fails at
once; local followers are also polled before every call. Any failure stops every rank (local followers are
killed, the process group destroyed, which also ends the remote ones) and raises `RankFailure`.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trinity.config import RunConfig, TorchTrainerConfig
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.sync.membership import MembershipRefused
from trinity.trainer.backend import TrainerBackend, build_backend
from trinity.trainer.ranks import rendezvous
from trinity.trainer.ranks.commands import END, STATE, RankState, encode_experiences, rank_state
from trinity.trainer.ranks.processes import LocalRanks, describe_exit, threads_per_rank
from trinity.v1 import common_pb2

log = get_logger(__name__)

_FAILURE_GRACE_S = 3.0  # how long a failed call waits for the failing rank's report or exit code
_END_TIMEOUT_S = 30.0


class RankFailure(RuntimeError):
    """A rank of a data-parallel trainer failed, died or did not join; every rank has been stopped.

    `ranks` maps each rank known to have failed to what happened to it (exit code, traceback)."""

    def __init__(self, message: str, ranks: dict[int, str] | None = None) -> None:
        self.ranks = ranks or {}
        details = "".join(f"\n--- rank {r}: {what}" for r, what in sorted(self.ranks.items()))
        super().__init__(message + details)


class ReplicatedBackend:
    """See the module docstring. `config.trainer` is a `TorchTrainerConfig` with `data_parallel_size > 1`;
    `secret`: the run's rank secret from the gateway (None without a token: the ranks prove nothing)."""

    def __init__(
        self, config: RunConfig, checkpoint_dir: Path | None, *, run_id: str, secret: bytes | None = None
    ) -> None:
        trainer = config.trainer
        if not isinstance(trainer, TorchTrainerConfig):
            raise ValueError(f"ReplicatedBackend trains the torch backend, not trainer.backend {trainer.backend!r}")
        if dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is already initialized in this trainer (another data-parallel run?); "
                "one trainer process drives one data-parallel run at a time"
            )
        self.trainer = trainer
        self.world_size = trainer.data_parallel_size
        self._lock = threading.RLock()
        self._open_stream: Generator[tuple[str, torch.Tensor], None, None] | None = None
        self._closed = False
        self._local: TrainerBackend | None = None
        self._last = (0, 0)  # (step, model_version) when the ranks stopped: status outlives the run
        self._groups: rendezvous.Groups | None = None
        started = time.monotonic()
        deadline = started + trainer.start_timeout_s
        store, port, announcement = rendezvous.host_run(
            trainer.master_addr,
            trainer.master_port,
            run_id,
            config.model_dump_json(),
            str(checkpoint_dir) if checkpoint_dir is not None else None,
            trainer.start_timeout_s,
            authenticated=secret is not None,
        )
        self._store: dist.PrefixStore | None = store
        self.address = f"{trainer.master_addr}:{port}"
        local_count = trainer.local_ranks or self.world_size
        threads = threads_per_rank(trainer.threads, local_count)
        torch.set_num_threads(threads)
        self._ranks = LocalRanks(
            first=1,
            count=local_count - 1,
            world_size=self.world_size,
            master_addr=trainer.master_addr,
            master_port=port,
            threads=threads,
            secret=secret,
        )
        log.info("ranks.starting", run_id=run_id, world_size=self.world_size, local=local_count, address=self.address)
        try:
            self._wait_for("joined", deadline, "join")
            self._groups = rendezvous.init_groups(self._store, 0, self.world_size, trainer, announcement, secret)
            self._local = build_backend(config, checkpoint_dir)
            self._wait_for("ready", deadline, "build their backend")
        except RankFailure:
            self._abandon()
            raise
        except MembershipRefused as refused:
            self._abandon()
            log.error("ranks.refused", run_id=run_id, ranks=refused.ranks, error=str(refused))
            failed = dict.fromkeys(refused.ranks, "refused: it did not prove it holds the run's rank secret")
            raise RankFailure(f"the trainer ranks at {self.address} did not form: {refused}", failed) from refused
        except Exception as err:
            raise self._failure("start-up", err) from err
        log.info("ranks.ready", run_id=run_id, world_size=self.world_size, seconds=time.monotonic() - started)

    # ----------------------------------------------------------------------------- TrainerBackend
    @property
    def model_version(self) -> int:
        return self._local.model_version if self._local is not None else self._last[1]

    @property
    def step(self) -> int:
        return self._local.step if self._local is not None else self._last[0]

    def train_step(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        with self._command("train_step", encode_experiences(experiences)):
            return self._backend.train_step(experiences)

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        with self._command("save_checkpoint", str(path) if path is not None else None):
            return self._backend.save_checkpoint(path)

    def load_checkpoint(self, path: str | Path) -> None:
        with self._command("load_checkpoint", str(path)):
            self._backend.load_checkpoint(path)

    def continue_versions_after(self, version: int) -> None:
        with self._command("continue_versions_after", version):
            self._backend.continue_versions_after(version)

    def warm_up(self) -> None:
        """Nothing: a sharded warm-up would have to make the same collectives on every rank; the first step pays."""

    @property
    def learning_rate(self) -> float:
        return self._backend.learning_rate  # the same on every rank

    def set_learning_rate(self, lr: float) -> None:
        with self._command("set_learning_rate", lr):
            self._backend.set_learning_rate(lr)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, streamed; every rank iterates them to the end even if the consumer stops early
        (closing the stream, or the next call, drains it)."""
        with self._lock:
            self._close_open_stream()
            self._open_stream = self._stream_weights()
            return self._open_stream

    def save_hf(self, out_dir: str | Path) -> Path:
        with self._command("save_hf", str(out_dir)):
            return self._backend.save_hf(out_dir)

    # ----------------------------------------------------------------------------- the ranks
    def rank_states(self) -> list[RankState]:
        """Each rank's step, model version and weights digest, by rank: replicas that agree have equal ones."""
        with self._command(STATE) as replies:
            own = rank_state(self._backend)
        return [own, *replies[1:]]

    @property
    def local_followers(self) -> LocalRanks:
        """The follower processes this host started (ranks 1..local_ranks-1)."""
        return self._ranks

    def close(self) -> None:
        """End the run on every rank and destroy the process group (the trainer may train another run)."""
        with self._lock:
            if self._closed:
                return
            try:
                with self._command(END):
                    pass
            except RankFailure as failure:
                log.warning("ranks.close_failed", error=one_line(failure))
                return
            if not self._ranks.wait(_END_TIMEOUT_S):
                log.warning("ranks.followers_lingered", seconds=_END_TIMEOUT_S)
            self._abandon()

    # ----------------------------------------------------------------------------- internals
    @property
    def _backend(self) -> TrainerBackend:
        if self._local is None:
            raise RankFailure(f"the trainer ranks at {self.address} were stopped; this run cannot continue")
        return self._local

    @contextmanager
    def _command(self, method: str, *args: Any) -> Iterator[list[Any]]:
        """Run `method` on every rank: broadcast it, run the body (rank 0's part), gather every rank's result
        into the yielded list. A failure anywhere stops every rank and raises `RankFailure`."""
        with self._lock:
            self._close_open_stream()
            self._check_ranks(method)
            assert self._groups is not None
            replies: list[Any] = [None] * self.world_size
            try:
                rendezvous.send_command(self._groups, (method, args), self.trainer.command_timeout_s)
                # A weights stream closed early has been drained: the call is complete.
                with suppress(GeneratorExit):
                    yield replies
                dist.gather_object(None, replies, dst=0, group=self._groups.replies)
            except RankFailure:
                self._abandon()
                raise
            except Exception as err:
                raise self._failure(method, err) from err

    def _stream_weights(self) -> Generator[tuple[str, torch.Tensor], None, None]:
        with self._command("named_weights"):
            local = self._backend.named_weights()
            try:
                # Not `yield from`: closing this stream would then close `local` before it is drained.
                for item in local:  # noqa: UP028
                    yield item
            finally:
                for _ in local:
                    pass  # each tensor is a collective the followers take part in: finish the set

    def _close_open_stream(self) -> None:
        # Not from inside the stream itself (its own command runs while it executes).
        if self._open_stream is not None and inspect.getgeneratorstate(self._open_stream) != inspect.GEN_RUNNING:
            stale, self._open_stream = self._open_stream, None
            stale.close()

    def _check_ranks(self, what: str) -> None:
        """Poll between calls: a follower that died or failed while the trainer was idle."""
        if self._closed:
            raise RankFailure(f"the trainer ranks at {self.address} were stopped; this run cannot continue")
        failed = self._failed_ranks()
        if failed:
            self._abandon()
            raise RankFailure(f"trainer rank(s) {sorted(failed)} failed before {what}", failed)

    def _failed_ranks(self) -> dict[int, str]:
        followers = range(1, self.world_size)
        failed = {r: describe_exit(code) for r, code in self._ranks.exited().items()}
        store = self._store
        if store is not None:
            for r in rendezvous.ranks_with(store, "error", followers):
                failed[r] = store.get(f"error/{r}").decode(errors="replace")
        return failed

    def _wait_for(self, key: str, deadline: float, what: str) -> None:
        """Until every follower has set `key/<rank>`; a follower that fails or dies first ends the wait."""
        followers = range(1, self.world_size)
        while True:
            self._check_ranks(what)
            assert self._store is not None
            missing = sorted(set(followers) - set(rendezvous.ranks_with(self._store, key, followers)))
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RankFailure(
                    f"trainer rank(s) {missing} did not {what} at {self.address} within "
                    f"{self.trainer.start_timeout_s:.0f}s (start_timeout_s); ranks beyond local_ranks="
                    f"{self.trainer.local_ranks} are started on other hosts with RANK, WORLD_SIZE={self.world_size}, "
                    f"MASTER_ADDR and MASTER_PORT set to this address",
                    {r: f"did not {what}" for r in missing},
                )
            time.sleep(0.1)

    def _failure(self, what: str, err: Exception) -> RankFailure:
        """The failure behind `err` (a follower's report or exit code, waited for briefly), every rank stopped."""
        deadline = time.monotonic() + _FAILURE_GRACE_S
        failed = self._failed_ranks()
        while not failed and time.monotonic() < deadline:
            time.sleep(0.1)
            failed = self._failed_ranks()
        if not failed and isinstance(err, rendezvous.CommandTimeout):
            # Alive (no exit code, no report) but deaf: gloo does not say which one, so every follower is named.
            limit = f"answered nothing within {self.trainer.command_timeout_s:g}s (command_timeout_s)"
            failed = dict.fromkeys(range(1, self.world_size), limit)
        self._abandon()
        log.error("ranks.failed", what=what, ranks=sorted(failed), error=one_line(err))
        return RankFailure(f"{what} failed on the trainer ranks (rank 0 saw: {one_line(err)})", failed)

    def _abandon(self) -> None:
        """Stop every rank: kill the local followers; destroying the group ends the remote ones' operations."""
        self._closed = True
        if self._local is not None:
            self._last = (self._local.step, self._local.model_version)
        self._local = None
        self._ranks.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        else:
            # A start that failed inside init_process_group (a member refused, or gone) used up torch's next group
            # name, which destroying a default group would reset: the next run's followers, fresh processes, name
            # their groups from 0, and would never meet ours.
            dist.distributed_c10d._world.group_count = 0
        self._groups = None
        self._store = None


def build_run_backend(
    config: RunConfig, checkpoint_dir: Path | None, *, run_id: str, rank_secret: Callable[[], bytes | None]
) -> TrainerBackend:
    """The backend of a run: replicated over `data_parallel_size` ranks for a torch run with more than one
    (proving membership with `rank_secret()`, asked only then), else the one `trainer.backend` names."""
    trainer = config.trainer
    if isinstance(trainer, TorchTrainerConfig) and trainer.data_parallel_size > 1:
        return ReplicatedBackend(config, checkpoint_dir, run_id=run_id, secret=rank_secret())
    return build_backend(config, checkpoint_dir)
