"""Training checkpoints: everything needed to continue a run bit-for-bit.

Layout of `<checkpoint_dir>/step_<n>/`: `policy.safetensors` (trainable state of the policy, LoRA
adapters included), `critic.safetensors` (PPO only), `optimizer.pt` (optimizer + scheduler),
`rng.pt` (torch, python, numpy and the backend's own generator), `state.json` (step, model version,
consumed experience ids). A checkpoint is written to a temporary directory and renamed into place, and
`latest` is updated after, so a crash mid-save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from trinity.trainer.metrics import CHECKPOINT_SECONDS

LATEST = "latest"


@dataclass
class TrainState:
    step: int = 0
    model_version: int = 0
    consumed_ids: list[str] = field(default_factory=list)

    def continue_versions_after(self, version: int) -> int:
        """Number the next weights after `version`: a resumed trainer whose predecessor published versions
        beyond its last checkpoint keeps the run's version sequence increasing."""
        self.model_version = max(self.model_version, version)
        return self.model_version


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
) -> Path:
    """Write checkpoint `step_<state.step>` under `root`; keep only the newest `keep` ones."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{state.step}.", dir=root))
    try:
        save_model(policy, str(tmp / "policy.safetensors"))
        if critic is not None:
            save_model(critic, str(tmp / "critic.safetensors"))
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
        torch.save(_rng_state(generator), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps(asdict(state)))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (root / f".{LATEST}.tmp").write_text(final.name)
    os.replace(root / f".{LATEST}.tmp", root / LATEST)
    if keep:
        steps = sorted((p for p in root.glob("step_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
        for old in steps[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


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
    """Restore everything `save` wrote into the given objects; returns the train state."""
    ckpt = resolve(path)
    load_model(policy, str(ckpt / "policy.safetensors"))
    if critic is not None:
        load_model(critic, str(ckpt / "critic.safetensors"))
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    _set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False), generator)
    return TrainState(**json.loads((ckpt / "state.json").read_text()))
