"""Child processes in their own sessions, and stopping a session with all its leftovers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from jsr_base import tail


def die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the bootstrap itself dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RayProcess:
    """A child in its own session (so its process group and session id are its pid)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def tail(self) -> list[str]:
        return tail(self.log_path)


def own_processes() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, session id) of this user's live processes."""
    table = {}
    uid = os.getuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fields_ = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields_[0] not in ("Z", "X"):
            table[int(entry.name)] = (int(fields_[1]), int(fields_[3]))
    return table


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def session_processes(roots: Iterable[int], markers: Iterable[str]) -> set[int]:
    """This user's processes of the sessions led by roots, their descendants, and those naming
    a marker path (Ray's temp dir): one node's Ray, to stop, or whose sockets are ours."""
    table = own_processes()
    root_set = set(roots)
    chosen = {pid for pid, (_ppid, sid) in table.items() if sid in root_set}
    frontier = set(root_set)
    while frontier:
        frontier = {pid for pid, (ppid, _sid) in table.items() if ppid in frontier} - chosen
        chosen |= frontier
    paths = [re.compile(re.escape(m) + r"(?=[/\s]|$)") for m in markers if m]
    chosen |= {pid for pid in table if any(p.search(cmdline(pid)) for p in paths)}
    chosen |= root_set & table.keys()
    chosen.discard(os.getpid())
    return chosen


def signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def stop_processes(roots: list[int], markers: list[str], deadline: float) -> list[str]:
    """SIGTERM the sessions and their leftovers, SIGKILL whatever is still there at deadline.

    Returns the command lines of the processes that needed SIGKILL.
    """
    signal_all(session_processes(roots, markers), signal.SIGTERM)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if not session_processes(roots, markers):
            return []
    left = session_processes(roots, markers)
    names = [cmdline(pid)[:120] for pid in left]
    signal_all(left, signal.SIGKILL)
    return names
