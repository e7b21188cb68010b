"""A virtual clock for code that waits: how long it would have waited, without waiting."""

from __future__ import annotations

import time
from types import SimpleNamespace


class VirtualClock:
    """``monotonic()`` and ``sleep()`` on virtual time; ``slept`` is the total waited."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds

    def as_time_module(self) -> SimpleNamespace:
        """A stand-in for a module's ``time``: wall time real, waits virtual."""
        return SimpleNamespace(time=time.time, monotonic=self.monotonic, sleep=self.sleep)
