"""The explorer's steering state (trinity.explorer.steering): pause, resume, the rollout temperature."""

from __future__ import annotations

import threading

from trinity.explorer.steering import Steering
from trinity.v1 import common_pb2


def test_an_unpaused_explorer_passes_at_once() -> None:
    assert Steering().hold_while_paused(threading.Event()) is True


def test_a_paused_explorer_holds_until_resumed() -> None:
    steering, stop = Steering(), threading.Event()
    steering.apply(common_pb2.Steering(pause_exploration=True), 1.0)
    result: list[bool] = []
    holder = threading.Thread(target=lambda: result.append(steering.hold_while_paused(stop)))
    holder.start()
    while not steering.holding:  # it is waiting in the hold, not past it
        holder.join(0.01)
    assert result == []
    steering.apply(common_pb2.Steering(pause_exploration=False), 1.0)
    holder.join()
    assert result == [True] and not steering.holding


def test_a_stopped_run_leaves_the_hold() -> None:
    steering, stop = Steering(), threading.Event()
    steering.apply(common_pb2.Steering(pause_exploration=True), 1.0)
    stop.set()
    assert steering.hold_while_paused(stop) is False


def test_the_steered_temperature_replaces_the_configured_one() -> None:
    steering = Steering()
    assert steering.temperature(1.0) == 1.0
    assert steering.apply(common_pb2.Steering(temperature=0.5), 1.0) == [("temperature", 1.0, 0.5)]
    assert steering.temperature(1.0) == 0.5


def test_only_changed_knobs_are_reported() -> None:
    steering = Steering()
    assert steering.apply(common_pb2.Steering(pause_exploration=False, temperature=1.0), 1.0) == []
    assert steering.apply(common_pb2.Steering(pause_exploration=True), 1.0) == [("pause_exploration", 0.0, 1.0)]
