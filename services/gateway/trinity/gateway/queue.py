"""Who gets the free services: the run queue and the explorer pool, planned from one look at the runs (docs/tenants.md).

Claims are served by priority, higher first. At one priority, pending runs come first, in the order they were queued
(`Run.queued_unix_ms`), then running runs that want more explorers than they have, the one fewest above its minimum
first, one explorer at a time. A pending run that cannot start yet reserves the free services it needs, so that
nothing after it takes them; what is left may still start a later run (backfill). A pending run waits without
reserving while its tenant's explorers in use leave no room for it under its quota. A pending run short of explorers
only asks running runs of its priority or lower to give back explorers above their minimum (the lowest priority
first, then the one with the most to spare), when that is enough for it to start: a run's spare never goes to a run
below it, and no run gives back twice for the same need, as explorers on their way out count as coming free.

`Stages.schedule_pending` carries out the starts, the waits and the pending timeout; `Scaler.adjust` the explorers
that join and leave."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from trinity.config import RunConfig
from trinity.config.modes import EXPLORER_MODES, TRAINER_MODES
from trinity.gateway.ledger import ROLE_EXPLORER, ROLE_TRAINER, RUNNING, RunLedger, active_explorers, all_finished
from trinity.gateway.runs import TERMINAL
from trinity.runtime.tenants import Quotas
from trinity.v1 import gateway_pb2

PENDING = gateway_pb2.RUN_STATE_PENDING


def roles_for(config: RunConfig) -> dict[str, int]:
    """How many instances of each role a run's mode needs."""
    explorers = config.explorer.num_workers if config.mode in EXPLORER_MODES else 0
    return {ROLE_EXPLORER: explorers, ROLE_TRAINER: 1 if config.mode in TRAINER_MODES else 0}


def wanted_explorers(ledger: RunLedger, run: gateway_pb2.Run) -> int:
    """The explorers a run wants: what ScaleRun asked for, else what its stage names."""
    return run.explorers or roles_for(ledger.stage_config(run))[ROLE_EXPLORER]


def queue_key(run: gateway_pb2.Run) -> tuple[int, int, str]:
    """A pending run's place: priority (higher first), then when it was queued (runs older than the field: created)."""
    return -run.priority, run.queued_unix_ms or run.created_unix_ms, run.id


def describe(counts: dict[str, int]) -> str:
    """ "1 trainer, 2 explorer" """
    return ", ".join(f"{n} {service}" for service, n in counts.items() if n > 0)


@dataclass
class Plan:
    start: list[str] = field(default_factory=list)  # pending runs to launch now, in queue order
    waiting: dict[str, str] = field(default_factory=dict)  # pending run -> why it waits
    # pending run -> what it needs beyond the live instances of a service, busy or not: only this times out
    short: dict[str, str] = field(default_factory=dict)
    grow: dict[str, int] = field(default_factory=dict)  # running run -> explorers to join
    leave: dict[str, tuple[int, str]] = field(default_factory=dict)  # running run -> (explorers it keeps, why)


@dataclass
class _Running:
    run: gateway_pb2.Run
    have: int  # active explorers (assigned, not leaving)
    wanted: int
    minimum: int  # what its stage names, or fewer where ScaleRun asked for fewer

    def spare(self) -> int:
        """Explorers it could give back; none while it sheds a surplus of its own (ScaleRun asked for fewer)."""
        return max(0, self.have - self.minimum) if self.have <= self.wanted else 0


class _Pool:
    """What a plan hands out: free instances, explorers on their way out, each tenant's explorers in use."""

    def __init__(self, ledger: RunLedger, runs: list[gateway_pb2.Run], launching: Collection[str]) -> None:
        self.ledger = ledger
        active = [r for r in runs if r.state not in TERMINAL]
        busy = {i for r in active for i in r.assignments}
        alive = {s: ledger.registry.alive(s) for s in (ROLE_EXPLORER, ROLE_TRAINER)}
        self.live = {s: len(found) for s, found in alive.items()}
        self.free = {s: sum(i.instance_id not in busy for i in found) for s, found in alive.items()}
        self.has_buffer = bool(ledger.registry.alive("buffer"))
        self.incoming = sum(len(r.leaving) for r in active)
        self.in_use: dict[str, int] = {}
        for run in active:
            held = sum(role == ROLE_EXPLORER for role in run.assignments.values())
            if run.id in launching and not run.assignments:  # a launch under way takes what its stage needs
                needs = roles_for(ledger.stage_config(run))
                held = needs[ROLE_EXPLORER]
                for service, n in needs.items():
                    self.free[service] = max(0, self.free[service] - n)
            self.in_use[run.tenant] = self.in_use.get(run.tenant, 0) + held

    def quotas(self, tenant: str) -> Quotas:
        """A tenant's quotas; none for the operator, or for a tenant no longer in the file."""
        found = self.ledger.tenants.tenant(tenant) if tenant else None
        return found.quotas if found is not None else Quotas()

    def room(self, tenant: str, explorers: int) -> bool:
        limit = self.quotas(tenant).explorers
        return limit is None or self.in_use.get(tenant, 0) + explorers <= limit


def _running(ledger: RunLedger, run: gateway_pb2.Run, launching: Collection[str]) -> _Running | None:
    """A running run whose explorers may change now: none while it launches, or once its stage is wrapping up."""
    if run.state != RUNNING or not run.assignments or run.id in launching:
        return None
    config = ledger.stage_config(run)
    if config.mode not in EXPLORER_MODES or all_finished(run, ROLE_TRAINER):
        return None
    if any(run.assignments.get(i) == ROLE_EXPLORER for i in run.finished):
        return None
    named = roles_for(config)[ROLE_EXPLORER]
    wanted = run.explorers or named
    return _Running(run, len(active_explorers(run)), wanted, min(named, wanted))


def plan(ledger: RunLedger, runs: list[gateway_pb2.Run], launching: Collection[str]) -> Plan:
    """Who gets what now, from `runs` (one read) and the runs whose launches are under way."""
    pool = _Pool(ledger, runs, launching)
    pending = sorted((r for r in runs if r.state == PENDING and r.id not in launching), key=queue_key)
    running = [x for x in (_running(ledger, r, launching) for r in runs) if x is not None]
    out = Plan()
    for shrinking in (x for x in running if x.have > x.wanted):
        out.leave[shrinking.run.id] = (shrinking.wanted, f"run scaled down to {shrinking.wanted} explorer(s)")
    reservers: dict[str, list[str]] = {s: [] for s in pool.free}  # waiting runs ahead that hold back a service
    for level in sorted({r.priority for r in pending} | {x.run.priority for x in running}, reverse=True):
        for run in (r for r in pending if r.priority == level):
            _queue(run, roles_for(ledger.stage_config(run)), pool, running, reservers, out)
        _grow([x for x in running if x.run.priority == level and x.run.id not in out.leave], pool, out)
    return out


def _queue(
    run: gateway_pb2.Run,
    needs: dict[str, int],
    pool: _Pool,
    running: list[_Running],
    reservers: dict[str, list[str]],
    out: Plan,
) -> None:
    """Start the pending run, or say why it waits, holding back what it needs of what is free."""
    short = {s: n - pool.live[s] for s, n in needs.items()} | {"buffer": 0 if pool.has_buffer else 1}
    if any(n > 0 for n in short.values()):
        out.short[run.id] = describe(short)
    if not pool.room(run.tenant, needs[ROLE_EXPLORER]):
        limit = pool.quotas(run.tenant).explorers
        out.waiting[run.id] = f"waiting: tenant {run.tenant}'s quota explorers={limit} is in use"
        return
    lacking = {s: n - pool.free[s] for s, n in needs.items() if n > pool.free[s]}
    # Only the first run waiting for explorers makes room: what it frees would go to it before any run behind it.
    only_explorers = set(lacking) == {ROLE_EXPLORER} and pool.has_buffer and not reservers[ROLE_EXPLORER]
    if not lacking and pool.has_buffer:
        out.start.append(run.id)
    elif only_explorers and _make_room(run, lacking[ROLE_EXPLORER], pool, running, out):
        out.waiting[run.id] = "waiting for explorers that other runs give back"
    else:
        ahead = next((reservers[s][0] for s in lacking if reservers[s]), None)
        busy = f"waiting for free services ({describe(lacking)})"
        out.waiting[run.id] = f"queued behind run {ahead}" if ahead else busy
    for service, n in needs.items():
        if run.id not in out.start and n:
            reservers[service].append(run.id)
        pool.free[service] -= min(n, pool.free[service])
    pool.in_use[run.tenant] = pool.in_use.get(run.tenant, 0) + needs[ROLE_EXPLORER]


def _make_room(run: gateway_pb2.Run, lacking: int, pool: _Pool, running: list[_Running], out: Plan) -> bool:
    """Count explorers on their way out toward the run, then ask runs of its priority or lower for their spare;
    whether that covers what it lacks (nothing is asked for otherwise)."""
    coming = min(pool.incoming, lacking)
    lacking -= coming
    victims = sorted(
        (x for x in running if x.run.priority <= run.priority and x.spare() > 0),
        key=lambda x: (x.run.priority, -x.spare(), x.run.id),
    )
    if lacking > sum(x.spare() for x in victims):
        return False
    pool.incoming -= coming
    for victim in victims:
        if lacking <= 0:
            break
        taken = min(victim.spare(), lacking)
        victim.have -= taken
        lacking -= taken
        out.leave[victim.run.id] = (victim.have, f"making room for run {run.id}")
    return True


def _grow(wanting: list[_Running], pool: _Pool, out: Plan) -> None:
    """Deal free explorers one at a time to the run fewest above its minimum, within its tenant's quota."""
    while pool.free[ROLE_EXPLORER] > 0:
        eligible = [x for x in wanting if x.have < x.wanted and pool.room(x.run.tenant, 1)]
        if not eligible:
            return
        chosen = min(eligible, key=lambda x: (x.have - x.minimum, x.run.id))
        chosen.have += 1
        out.grow[chosen.run.id] = out.grow.get(chosen.run.id, 0) + 1
        pool.free[ROLE_EXPLORER] -= 1
        pool.in_use[chosen.run.tenant] = pool.in_use.get(chosen.run.tenant, 0) + 1
