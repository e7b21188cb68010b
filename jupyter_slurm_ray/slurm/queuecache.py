"""One ``squeue`` for all of a user's clusters on one host, shared by the kernels and the Jupyter
server: slurmctld is shared by hundreds of users and often rate-limited.

A process that needs the queue takes the shared answer when it is recent enough; otherwise it
takes a lock, asks ``squeue --me -t all`` (every job of the user, ended ones that Slurm still
remembers included) and writes the answer for the others. The answer lives in the user's
private state directory, one file per target (where Slurm commands run).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from ..files import write_atomic

log = logging.getLogger(__name__)

LOCK_WAIT = 10.0  # seconds: then ask Slurm without the lock rather than wait on a stuck process


class SharedQueue:
    """The latest ``squeue --me`` output of one target, shared through a file."""

    def __init__(self, directory: Path, target: str) -> None:
        key = hashlib.sha1(f"{socket.gethostname()} {target}".encode()).hexdigest()[:16]
        self.path = directory / f"queue-{key}.json"
        self._lock_path = directory / f"queue-{key}.lock"
        self._in_process = asyncio.Lock()
        self.asked = 0  # how many times this process asked Slurm itself

    async def output(self, max_age: float, ask: Callable[[], Awaitable[str]]) -> str:
        """squeue's output, no older than ``max_age`` seconds (asked with ``ask`` if needed)."""
        cached = self._read(max_age)
        if cached is not None:
            return cached
        async with self._in_process, self._locked():
            cached = self._read(max_age)  # another process may have just asked
            if cached is not None:
                return cached
            text = await ask()
            self.asked += 1
            self._write(text)
            return text

    def _read(self, max_age: float) -> str | None:
        try:
            data = json.loads(self.path.read_text())
            taken, text = float(data["taken"]), str(data["output"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return text if 0 <= time.time() - taken <= max_age else None

    def _write(self, text: str) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps({"taken": time.time(), "output": text}), 0o600)
        except OSError as exc:
            log.debug("cannot share the queue in %s: %s", self.path, exc)

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        fd = await asyncio.to_thread(_acquire, self._lock_path)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)


def _acquire(path: Path) -> int | None:
    """An exclusive flock on ``path`` within LOCK_WAIT, else None (go on without it)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.02)
