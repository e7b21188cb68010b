"""Which process owns or observes a cluster, and whether it still runs: pid plus start time,
per host.

A pid alone is not an identity (pids are reused); the start time since boot, with the boot id,
is. Whether a process lives can only be judged on its own host: elsewhere the answer is None.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def same_as(self, other: ProcessIdentity | None) -> bool:
        """The same process (a start time missing on either side is not held against it)."""
        if other is None or (self.host, self.pid) != (other.host, other.pid):
            return False
        return self.started is None or other.started is None or self.started == other.started

    def describe(self) -> str:
        """``pid 4242 on login1``: how every view names an owner or an observer."""
        return f"pid {self.pid} on {self.host or 'an unknown host'}"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started}

    @classmethod
    def from_dict(cls, data: Any) -> ProcessIdentity | None:
        """An identity from a record or a lease; None when it does not have the right shape."""
        if not isinstance(data, Mapping):
            return None
        host, pid, started = data.get("host"), data.get("pid"), data.get("started")
        if not isinstance(host, str) or not isinstance(pid, int) or isinstance(pid, bool):
            return None
        if started is not None and not isinstance(started, str):
            return None
        return cls(host, pid, started)


def this_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(socket.gethostname(), pid, process_started(pid))
