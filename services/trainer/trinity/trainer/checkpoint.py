"""Training checkpoints: everything needed to continue a run bit-for-bit.

Layout of `<checkpoint_dir>/step_<n>/`: `dcp/` (a `torch.distributed.checkpoint` of the policy, the
critic when PPO has one, and the optimizer state, keyed by parameter name: each rank writes its own
shards, and a checkpoint loads onto any number of ranks), `scheduler.pt`, `rng.pt` (torch, python, numpy
and the backend's own generator: the same on every rank, which share one seed), `state.json` (step, model
version, consumed experience ids, the KL coefficient). A checkpoint is written to a temporary directory and
renamed into place, and `latest` is updated after, so a crash mid-save leaves the previous checkpoint intact; a save
that fails (a full disk) removes what it wrote and raises `CheckpointNotWritten` naming the directory, the cause and
the newest complete checkpoint. With several ranks the directory must be one that every rank sees (shared storage
across hosts).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trinity.runtime.errors import one_line
from trinity.trainer.metrics import CHECKPOINT_SECONDS

LATEST = "latest"


@dataclass
class TrainState:
    step: int = 0
    model_version: int = 0
    consumed_ids: list[str] = field(default_factory=list)
    kl_coef: float | None = None  # the KL controller's coefficient for the next step (None: a fixed one)

    def continue_versions_after(self, version: int) -> int:
        """Number the next weights after `version`: a resumed trainer whose predecessor published versions
        beyond its last checkpoint keeps the run's version sequence increasing."""
        self.model_version = max(self.model_version, version)
        return self.model_version


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written; nothing of it is left, and `latest` still names the previous one."""


def _rng_state(generator: torch.Generator) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generator": generator.get_state(),
    }


def _set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    generator.set_state(state["generator"])


class _Trained(nn.Module):
    """The trained models under stable names (`policy.`, `critic.`), however each is wrapped or sharded."""

    def __init__(self, policy: nn.Module, critic: nn.Module | None) -> None:
        super().__init__()
        self.policy = policy
        if critic is not None:
            self.critic = critic


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _one_or_all_ranks() -> Iterator[None]:
    """DCP warns on every single-process save and load; one process is a layout this backend intends."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if _distributed():
        dist.barrier()


@CHECKPOINT_SECONDS.time()
def save(
    root: str | Path,
    *,
    policy: nn.Module,
    critic: nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    generator: torch.Generator,
    state: TrainState,
    keep: int | None = None,
    rank: int = 0,
) -> Path:
    """Write checkpoint `step_<state.step>` under `root`; keep only the newest `keep` ones.

    A collective with several ranks: each writes its shards, rank 0 the rest and the rename."""
    root = Path(root)
    final = root / f"step_{state.step}"
    tmp = root / f".step_{state.step}.partial"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    try:
        models, optim = get_state_dict(_Trained(policy, critic), optimizer)
        with _one_or_all_ranks():
            dcp.save({"model": models, "optimizer": optim}, checkpoint_id=str(tmp / "dcp"), no_dist=not _distributed())
        if rank == 0:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(_rng_state(generator), tmp / "rng.pt")
            (tmp / "state.json").write_text(json.dumps(asdict(state)))
            publish(tmp, final, keep)
    except (OSError, RuntimeError, CheckpointException) as err:
        # A full disk surfaces as an OSError, or (torch's zip writer) a RuntimeError, possibly inside DCP's
        # CheckpointException: the free space, measured before the partial files go, says which it was.
        free_mib = shutil.disk_usage(root).free / 2**20
        shutil.rmtree(tmp, ignore_errors=True)
        latest = root / LATEST
        kept = latest.read_text().strip() if latest.is_file() else "none"
        raise CheckpointNotWritten(
            f"checkpoint step_{state.step} was not written to {root}: {_cause(err)} ({free_mib:.1f} MiB free "
            f"there); the newest complete checkpoint is still {kept}"
        ) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier()
    return final


def _cause(err: BaseException) -> str:
    """What failed a save, in one line: the error, or the first rank's inside DCP's CheckpointException."""
    if isinstance(err, CheckpointException) and err.failures:
        err = next(iter(err.failures.values()))[0]
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return one_line(err)


def publish(tmp: Path, final: Path, keep: int | None) -> None:
    """Rename a fully written checkpoint into place, point `latest` at it, keep the newest `keep`."""
    root = final.parent
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    (root / f".{LATEST}.tmp").write_text(final.name)
    os.replace(root / f".{LATEST}.tmp", root / LATEST)
    if keep:
        steps = sorted((p for p in root.glob("step_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
        for old in steps[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def resolve(path: str | Path) -> Path:
    """A checkpoint directory: `path` itself, or the one a root's `latest` file names."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    latest = path / LATEST
    if latest.is_file():
        return path / latest.read_text().strip()
    raise FileNotFoundError(f"no checkpoint at {path} (expected state.json or a '{LATEST}' file)")


def load(
    path: str | Path,
    *,
    policy: nn.Module,
    critic: nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    generator: torch.Generator,
) -> TrainState:
    """Restore everything `save` wrote into the given objects (resharded to this run's ranks); the train state."""
    ckpt = resolve(path)
    trained = _Trained(policy, critic)
    models, optim = get_state_dict(trained, optimizer)
    with _one_or_all_ranks():
        dcp.load({"model": models, "optimizer": optim}, checkpoint_id=str(ckpt / "dcp"), no_dist=not _distributed())
    set_state_dict(trained, optimizer, model_state_dict=models, optim_state_dict=optim)
    scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
    _set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False), generator)
    return TrainState(**json.loads((ckpt / "state.json").read_text()))
