"""What a person may change in a live exploration (docs/console.md, "Steering"): pause and the rollout temperature.

The explore loop reads both at a step boundary (`hold_while_paused` before leasing, `temperature` when it builds
the step's rollout settings), so a step in progress is never changed under it. The Steer RPC writes them from
another thread: every read and write holds the lock.
"""

from __future__ import annotations

import threading

from trinity.v1 import common_pb2

STEER_POLL_S = 0.2  # how often a paused loop looks at the stop event while it holds


class Steering:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resumed = threading.Event()
        self._resumed.set()
        self._temperature: float | None = None
        self._holding = False

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    @property
    def holding(self) -> bool:
        """The explore loop is waiting in `hold_while_paused`: no step is in progress."""
        return self._holding

    def temperature(self, configured: float) -> float:
        """The rollout temperature: the steered one, else `configured` (explorer.temperature)."""
        with self._lock:
            return configured if self._temperature is None else self._temperature

    def hold_while_paused(self, stop: threading.Event) -> bool:
        """Block while exploration is paused; True once resumed (or never paused), False when `stop` is set first."""
        self._holding = True
        try:
            while not self._resumed.wait(STEER_POLL_S):
                if stop.is_set():
                    return False
        finally:
            self._holding = False
        return not stop.is_set()

    def apply(self, steering: common_pb2.Steering, configured_temperature: float) -> list[tuple[str, float, float]]:
        """Set the knobs `steering` sets; (knob, old, new) for each that changed value."""
        changes: list[tuple[str, float, float]] = []
        with self._lock:
            if steering.HasField("temperature"):
                old = configured_temperature if self._temperature is None else self._temperature
                self._temperature = steering.temperature
                if old != steering.temperature:
                    changes.append(("temperature", old, steering.temperature))
            if steering.HasField("pause_exploration"):
                was_paused = not self._resumed.is_set()
                if steering.pause_exploration:
                    self._resumed.clear()
                else:
                    self._resumed.set()
                if was_paused != steering.pause_exploration:
                    changes.append(("pause_exploration", float(was_paused), float(steering.pause_exploration)))
        return changes
