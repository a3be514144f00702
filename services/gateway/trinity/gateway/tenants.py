"""What a tenant may do (docs/tenants.md): the runs it sees and acts on, and the quotas CreateRun and ScaleRun check.
The operator (the services' own token, `OPERATOR`) has no quotas and sees every run."""

from __future__ import annotations

from collections.abc import Iterable

from trinity.config import RunConfig
from trinity.config.modes import TRAINER_MODES
from trinity.config.trainer import MegatronTrainerConfig
from trinity.gateway.ledger import ROLE_EXPLORER, RUNNING, RunLedger
from trinity.gateway.queue import roles_for, wanted_explorers
from trinity.gateway.runs import TERMINAL
from trinity.runtime.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from trinity.runtime.tenants import MAX_PRIORITY, Tenant
from trinity.v1 import gateway_pb2


def trainer_ranks(config: RunConfig) -> int:
    """The processes a stage's trainer runs: its data-parallel ranks, times tensor and pipeline parallelism under
    Megatron; none where the mode trains nothing."""
    if config.mode not in TRAINER_MODES:
        return 0
    trainer = config.trainer
    return trainer.world_size if isinstance(trainer, MegatronTrainerConfig) else trainer.data_parallel_size


def sees(caller: Tenant, run: gateway_pb2.Run) -> bool:
    return caller.is_operator or run.tenant == caller.name


def owned(caller: Tenant, run: gateway_pb2.Run) -> gateway_pb2.Run:
    """The run, when the caller may act on it; PERMISSION_DENIED (not naming the owner) otherwise."""
    if not sees(caller, run):
        raise PermissionDenied(f"run {run.id} is not a run of tenant {caller.name}; a tenant acts on its own runs")
    return run


def check_priority(caller: Tenant, priority: int) -> None:
    if not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument("priority", f"must be between 0 and {MAX_PRIORITY}, got {priority}")
    if priority > caller.max_priority:
        raise PermissionDenied(
            f"tenant {caller.name} may queue runs at priority {caller.max_priority} at most (its max_priority), "
            f"got {priority}"
        )


def check_config(caller: Tenant, config: RunConfig) -> None:
    """Every stage fits the tenant's explorers and trainer_ranks quotas (a stage over them could never start)."""
    quotas = caller.quotas
    for stage, stage_config in enumerate(config.stage_configs()):
        explorers = roles_for(stage_config)[ROLE_EXPLORER]
        if quotas.explorers is not None and explorers > quotas.explorers:
            raise ResourceExhausted(
                f"tenant {caller.name}'s quota explorers={quotas.explorers}: stage {stage} asks for "
                f"explorer.num_workers={explorers}"
            )
        ranks = trainer_ranks(stage_config)
        if quotas.trainer_ranks is not None and ranks > quotas.trainer_ranks:
            raise ResourceExhausted(
                f"tenant {caller.name}'s quota trainer_ranks={quotas.trainer_ranks}: stage {stage} asks for a "
                f"trainer of {ranks} ranks (trainer.data_parallel_size, times tensor and pipeline parallelism)"
            )


def check_runs(caller: Tenant, runs: Iterable[gateway_pb2.Run]) -> None:
    """Room for one more run of the tenant under its runs quota."""
    limit = caller.quotas.runs
    if limit is None:
        return
    mine = sum(run.tenant == caller.name and run.state not in TERMINAL for run in runs)
    if mine >= limit:
        raise ResourceExhausted(
            f"tenant {caller.name} has {mine} runs pending, running or paused: its quota runs={limit}"
        )


def check_scale(ledger: RunLedger, caller: Tenant, run: gateway_pb2.Run, explorers: int) -> None:
    """The tenant's running runs, `run` wanting `explorers`, want no more explorers than its quota."""
    limit = caller.quotas.explorers
    if limit is None:
        return
    others = [r for r in ledger.runs.all() if r.tenant == caller.name and r.state == RUNNING and r.id != run.id]
    total = explorers + sum(wanted_explorers(ledger, r) for r in others)
    if total > limit:
        raise ResourceExhausted(
            f"tenant {caller.name}'s running runs would want {total} explorers: its quota explorers={limit}"
        )
