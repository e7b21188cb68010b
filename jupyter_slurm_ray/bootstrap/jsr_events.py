"""The job dir files the bootstrap talks through: events.jsonl and the owner's lease.

The owner (a notebook kernel) rewrites ``lease`` every renew_every s with one JSON object
``{"pid", "host", "seq", "t" (its time.time()), "renew_every"}``; older owners write
``"PID COUNTER"``. Only a change of content, seen on this node's own clock, proves the owner
alive; ``t`` lets a job that waited in the queue see at once that its owner left long ago.
Three clocks are involved (the owner's, this node's, the job dir's filesystem's), any two of
which may disagree: a lease is judged gone at once only when the owner's ``t`` and the lease
file's modification time (stamped by the filesystem, compared with a file this node writes
there now, so by the filesystem's clock alone) both say it is older than owner_timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsr_base import short_hostname
from jsr_wire import DETACHED_FILE, LEASE_FILE, Event

LEASE_PERIOD = 1.0
MAX_LEASE = 64 * 1024  # bytes of the lease file read


class EventLog:
    """Appends one JSON object per line to events.jsonl (one write per line, O_APPEND)."""

    def __init__(self, path: Path, role: str) -> None:
        self.path = path
        self.role = role
        self.host = short_hostname()
        self.fields: dict[str, Any] = {}  # added to every event (a worker job: its job id)

    def emit(self, event: str, **extra: Any) -> None:
        record = {"t": time.time(), "event": event, "host": self.host, "role": self.role}
        record.update(self.fields, **extra)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o600)
        try:
            os.write(fd, (json.dumps(record, default=str) + "\n").encode())
        finally:
            os.close(fd)
        summary = " ".join(f"{k}={v}" for k, v in extra.items() if k not in ("log", "ports"))
        print(f"[bootstrap {self.role}@{self.host}] {event} {summary}", file=sys.stderr, flush=True)

    def phase(self, phase: str, **extra: Any) -> None:
        self.emit(Event.PHASE, phase=phase, **extra)


class EventTail:
    """Reads the events other nodes append after this process started."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        events = []
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events


class LeaseWatch:
    """Stale when the lease file's content did not change for owner_timeout (own clock)."""

    def __init__(self, job_dir: Path, owner_timeout: float) -> None:
        self.path = job_dir / LEASE_FILE
        self.detached = job_dir / DETACHED_FILE
        self.owner_timeout = owner_timeout
        self.content = self.read()
        self.changed_at = time.monotonic()
        self.checked_at = 0.0

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def stale(self) -> bool:
        now = time.monotonic()
        if self.owner_timeout <= 0 or now - self.checked_at < LEASE_PERIOD:
            return False
        self.checked_at = now
        content = self.read()
        if content != self.content or self.detached.exists():
            self.content, self.changed_at = content, now
            return False
        return now - self.changed_at > self.owner_timeout


@dataclass
class LeaseFile:
    """What the lease file says: when the owner last renewed it (its clock) and how often;
    and when the file was written (the filesystem's clock)."""

    content: bytes | None
    t: float | None = None
    renew_every: float | None = None
    mtime: float | None = None

    @classmethod
    def read(cls, path: Path) -> LeaseFile:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                mtime = os.fstat(fd).st_mtime  # after open: fresh even on NFS (close-to-open)
                content = handle.read(MAX_LEASE)
        except OSError:
            return cls(None)
        try:
            data = json.loads(content)
        except ValueError:
            return cls(content, mtime=mtime)  # "PID COUNTER": the old format, no time in it
        if not isinstance(data, dict):
            return cls(content, mtime=mtime)
        return cls(content, number(data.get("t")), number(data.get("renew_every")), mtime)


def filesystem_now(directory: Path) -> float | None:
    """The clock of the filesystem holding ``directory``, now: the modification time of a file
    written there just now (on NFS the server stamps it, as it stamped the lease)."""
    path = directory / f".clock-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        os.write(fd, b"t")
        os.fsync(fd)
        return os.fstat(fd).st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()


def number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    return float(value) if ok else None  # type: ignore[arg-type]


def duration(seconds: float) -> str:
    """3:12:05, or 42 s."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def owner_gone(
    job_dir: Path, owner_timeout: float, stopped: Callable[[], bool]
) -> dict[str, Any] | None:
    """Before anything starts: the owner_gone event's fields if the owner left, else None.

    Fresh when the lease was renewed within owner_timeout (owner's clock). Gone at once when
    the lease file was also last written more than owner_timeout ago by the filesystem's
    clock. Otherwise (the clocks disagree, or the lease has no time) wait up to
    min(owner_timeout, 2 * renew_every + 3) s for its content to change (this node's clock).
    Returns None at once when detached, without a timeout, or when `stopped()`.
    """
    if owner_timeout <= 0 or (job_dir / DETACHED_FILE).exists():
        return None
    path = job_dir / LEASE_FILE
    lease = LeaseFile.read(path)
    age = time.time() - lease.t if lease.t is not None else None
    if age is not None and age <= owner_timeout:
        return None
    written = file_age(job_dir, lease)
    if age is not None and written is not None and written > owner_timeout:
        return gone_fields(f"was last renewed {duration(age)} ago", owner_timeout, age, written)
    renew_every = lease.renew_every or min(10.0, owner_timeout / 4)
    wait = min(owner_timeout, 2 * renew_every + 3)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not stopped():
        time.sleep(0.25)
        if LeaseFile.read(path).content != lease.content or (job_dir / DETACHED_FILE).exists():
            return None
    if stopped():
        return None
    if age is not None:
        last = f"was last renewed {duration(age)} ago"
    elif lease.content is None:
        last = f"is missing and did not appear within {wait:.0f} s"
    else:
        last = f"has no renewal time and did not change within {wait:.0f} s"
    return gone_fields(last, owner_timeout, age, written, waited=wait)


def file_age(job_dir: Path, lease: LeaseFile) -> float | None:
    """Seconds since the lease file was written, by the filesystem's own clock."""
    now = filesystem_now(job_dir) if lease.mtime is not None else None
    return None if now is None or lease.mtime is None else now - lease.mtime


def gone_fields(
    last: str, owner_timeout: float, age: float | None, written: float | None, waited: float = 0
) -> dict[str, Any]:
    reason = (
        f"the owner's lease {last} (owner_timeout {owner_timeout:g} s): "
        "the owner is gone, Ray was not started"
    )
    return {
        "reason": reason,
        "lease_age": None if age is None else round(age, 1),
        "lease_file_age": None if written is None else round(written, 1),
        "waited": round(waited, 1),
    }
