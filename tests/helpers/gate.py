"""A session that starts before it may run: scripts/run-tests starts the rest of the real tier
(its workers import and collect for about 20 s of CPU) while the tests marked ``exclusive``
still have the testbed to themselves, and opens the gate once they have ended.

The gate is a file named by ``$JSR_REAL_TIER_GATE``: empty while closed, then ``run``, or
``stop`` and a reason (the steps before failed: the session ends without running a test).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

VARIABLE = "JSR_REAL_TIER_GATE"
LONGEST_WAIT = 3600.0  # s: the exclusive tests take minutes; an hour means something is stuck


def wait_at_the_gate(step: float = 0.2) -> None:
    """Return once the gate says ``run`` (at once without a gate); pytest.exit otherwise."""
    name = os.environ.get(VARIABLE)
    if not name:
        return
    gate = Path(name)
    deadline = time.monotonic() + LONGEST_WAIT
    while time.monotonic() < deadline:
        try:
            word = gate.read_text().strip()
        except OSError as exc:
            pytest.exit(f"{VARIABLE}: cannot read the gate {gate}: {exc}", returncode=3)
        if word == "run":
            return
        if word.startswith("stop"):
            pytest.exit(f"not run: {word}", returncode=3)
        time.sleep(step)
    pytest.exit(f"{VARIABLE}: the gate {gate} stayed closed for {LONGEST_WAIT:g} s", returncode=3)
