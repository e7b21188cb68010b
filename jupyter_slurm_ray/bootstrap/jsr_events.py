"""The job dir files the bootstrap talks through: events.jsonl and the owner's lease."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from jsr_base import short_hostname

LEASE_PERIOD = 1.0


class EventLog:
    """Appends one JSON object per line to events.jsonl (one write per line, O_APPEND)."""

    def __init__(self, path: Path, role: str) -> None:
        self.path = path
        self.role = role
        self.host = short_hostname()

    def emit(self, event: str, **extra: Any) -> None:
        record = {"t": time.time(), "event": event, "host": self.host, "role": self.role, **extra}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(record, default=str) + "\n").encode())
        finally:
            os.close(fd)
        summary = " ".join(f"{k}={v}" for k, v in extra.items() if k not in ("log", "ports"))
        print(f"[bootstrap {self.role}@{self.host}] {event} {summary}", file=sys.stderr, flush=True)

    def phase(self, phase: str, **extra: Any) -> None:
        self.emit("phase", phase=phase, **extra)


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
    """Stale when the lease file's content did not change for idle_timeout (own clock)."""

    def __init__(self, job_dir: Path, idle_timeout: float) -> None:
        self.path = job_dir / "lease"
        self.detached = job_dir / "detached"
        self.idle_timeout = idle_timeout
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
        if self.idle_timeout <= 0 or now - self.checked_at < LEASE_PERIOD:
            return False
        self.checked_at = now
        content = self.read()
        if content != self.content or self.detached.exists():
            self.content, self.changed_at = content, now
            return False
        return now - self.changed_at > self.idle_timeout
