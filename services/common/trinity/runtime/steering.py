"""The bounds of a steering request (trinity.v1.Steering) and the modes whose runs can apply each knob, checked alike
by the gateway and the services."""

from __future__ import annotations

import math

from trinity.config.modes import EXPLORING_MODES, TRAINER_MODES, RunMode
from trinity.runtime.errors import FailedPrecondition, InvalidArgument
from trinity.runtime.limits import MIN_TEMPERATURE
from trinity.v1 import common_pb2

KNOBS = ("pause_exploration", "temperature", "learning_rate")  # Steering's fields, in order
EXPLORER_KNOBS = ("pause_exploration", "temperature")
TRAINER_KNOBS = ("learning_rate",)
MAX_TEMPERATURE = 2.0


def knobs_set(steering: common_pb2.Steering) -> list[str]:
    return [knob for knob in KNOBS if steering.HasField(knob)]


def check_steering(steering: common_pb2.Steering, owned: tuple[str, ...] = KNOBS) -> list[str]:
    """The knobs `steering` sets, each within its bounds and among those the caller applies (`owned`);
    INVALID_ARGUMENT naming the field otherwise."""
    knobs = knobs_set(steering)
    if foreign := [k for k in knobs if k not in owned]:
        owner = "the trainer applies" if foreign[0] in TRAINER_KNOBS else "the explorers apply"
        raise InvalidArgument(f"steering.{foreign[0]}", f"{owner} this knob, not this service")
    if not knobs:
        raise InvalidArgument("steering", f"set at least one of {', '.join(KNOBS)}")
    if steering.HasField("temperature"):
        t = steering.temperature
        if not (math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE):
            raise InvalidArgument("steering.temperature", f"must be between 0 and {MAX_TEMPERATURE:g}, got {t}")
        if 0 < t < MIN_TEMPERATURE:
            raise InvalidArgument("steering.temperature", f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}")
    if steering.HasField("learning_rate"):
        lr = steering.learning_rate
        if not (math.isfinite(lr) and lr > 0):
            raise InvalidArgument("steering.learning_rate", f"must be a finite number > 0, got {lr}")
    return knobs


def check_steerable(mode: RunMode, knobs: list[str]) -> None:
    """FAILED_PRECONDITION for a knob that a run of `mode` has no service (or no loop) to apply."""
    if "temperature" in knobs and mode == RunMode.SERVE:
        raise FailedPrecondition("steering.temperature: a serve-mode run samples as its clients ask, per request")
    explorer = [k for k in knobs if k in EXPLORER_KNOBS]
    if explorer and mode not in EXPLORING_MODES:
        raise FailedPrecondition(f"steering.{explorer[0]}: a run of mode {mode!r} does not explore")
    trainer = [k for k in knobs if k in TRAINER_KNOBS]
    if trainer and mode not in TRAINER_MODES:
        raise FailedPrecondition(f"steering.{trainer[0]}: a run of mode {mode!r} has no trainer")
