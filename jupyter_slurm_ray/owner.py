"""Which process owns a cluster, and whether it still runs: pid plus start time, per host.

A pid alone is not an identity (pids are reused); the start time since boot, with the boot id,
is. Whether a process lives can only be judged on its own host: elsewhere the answer is None.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path


def process_started(pid: int) -> str | None:
    """``"<boot id>:<start time in clock ticks>"`` of a live (non-zombie) process, else None."""
    try:
        return _started(pid)
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """Like process_started, but OSError when /proc has no readable entry for the pid."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except IndexError:
        return None
    if after_name[0] in ("Z", "X"):
        return None
    return f"{_boot_id()}:{after_name[19]}"


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "?"


@dataclass(frozen=True)
class ProcessIdentity:
    host: str
    pid: int
    started: str | None  # process_started() when it was recorded; None for old records

    @property
    def alive(self) -> bool | None:
        """True/False on the process's own host; None elsewhere (cannot be judged)."""
        if self.host != socket.gethostname():
            return None
        try:
            now = _started(self.pid)
        except OSError:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except OSError:
                return None
            return None  # it exists but /proc hides it: cannot judge
        if now is None:
            return False  # a zombie
        return self.started is None or now == self.started


def this_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(socket.gethostname(), pid, process_started(pid))
