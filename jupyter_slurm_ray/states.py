"""Cluster states and how Slurm's view of the job plus the bootstrap's events map onto them.

Pure logic: ``derive_status`` takes what Slurm says (``JobInfo``) and what the bootstrap wrote
(``events.jsonl``) and returns the one truthful ``Status`` that every view shows.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from .slurm import JobInfo


class State(str, enum.Enum):
    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    STARTING = "STARTING"
    READY = "READY"
    CONNECTED = "CONNECTED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"

    @property
    def is_final(self) -> bool:
        return self in FINAL

    @property
    def is_up(self) -> bool:
        return self in (State.READY, State.CONNECTED)

    def __str__(self) -> str:
        return self.value


FINAL = frozenset(
    {State.STOPPED, State.FAILED, State.TIMEOUT, State.CANCELLED, State.PREEMPTED, State.NODE_FAIL}
)

# Slurm's final job states → ours. COMPLETED means the bootstrap exited on its own.
_SLURM_FINAL = {
    "COMPLETED": State.STOPPED,
    "CANCELLED": State.CANCELLED,
    "TIMEOUT": State.TIMEOUT,
    "PREEMPTED": State.PREEMPTED,
    "NODE_FAIL": State.NODE_FAIL,
    "BOOT_FAIL": State.NODE_FAIL,
    "DEADLINE": State.TIMEOUT,
}


@dataclass(frozen=True)
class Status:
    """One moment of a cluster's life, as shown by the widget, the magics and the sidebar."""

    state: State
    at: float = field(default_factory=time.time)
    reason: str | None = None  # Slurm's pending reason, or why it failed/stopped
    phase: str | None = None  # bootstrap phase while STARTING
    nodes_joined: int = 0
    nodes_wanted: int = 0
    job_id: str | None = None
    nodes: tuple[str, ...] = ()
    estimated_start: datetime | None = None
    time_left: int | None = None
    time_limit: int | None = None
    log_tail: str = ""
    walltime_warning: bool = False

    def same_as(self, other: Status | None) -> bool:
        """Equal in everything a viewer would notice (the timestamp excluded)."""
        if other is None:
            return False
        keys = ("state", "reason", "phase", "nodes_joined", "job_id", "nodes", "log_tail")
        return all(getattr(self, k) == getattr(other, k) for k in keys) and (
            self.estimated_start == other.estimated_start
            and self.walltime_warning == other.walltime_warning
        )

    def describe(self) -> str:
        """One line for humans: ``PENDING (Resources), est. start 12:03``."""
        parts = [self.state.value]
        if self.state is State.STARTING:
            parts.append(
                f"{self.phase or 'starting'}, {self.nodes_joined}/{self.nodes_wanted} nodes"
            )
        elif self.reason:
            parts.append(f"({self.reason})")
        if self.state is State.PENDING and self.estimated_start:
            parts.append(f"est. start {self.estimated_start:%Y-%m-%d %H:%M}")
        if self.job_id:
            parts.append(f"job {self.job_id}")
        if self.time_left is not None and self.state.is_up:
            parts.append(f"{_hms(self.time_left)} left")
        return " ".join(parts)


def status_of_record(record: Any) -> Status:
    """The status a registry record last saw (``record`` is a ``registry.ClusterRecord``)."""
    try:
        state = State(record.state)
    except ValueError:
        state = State.FAILED
    return Status(
        state,
        at=record.updated_at,
        reason=record.reason,
        phase=record.phase,
        nodes_joined=record.nodes_joined,
        nodes_wanted=record.nodes_wanted,
        job_id=record.job_id,
        time_limit=record.time_limit,
        time_left=record.time_left,
    )


def _hms(seconds: int) -> str:
    h, rest = divmod(int(seconds), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass
class EventSummary:
    """What the bootstrap's events.jsonl says so far."""

    phase: str | None = None
    joined: int = 0
    ready: bool = False
    error: str | None = None
    error_log: str = ""
    walltime_warning: bool = False
    lease_stale: bool = False
    stopped: bool = False
    node_lost: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        for ev in events:
            self.events.append(ev)
            kind = ev.get("event")
            if kind == "phase":
                self.phase = ev.get("phase", self.phase)
                self.joined = int(ev.get("joined", self.joined) or 0)
            elif kind == "nodes":
                self.joined = int(ev.get("joined", self.joined) or 0)
            elif kind == "ready":
                self.ready = True
                self.joined = int(ev.get("joined", ev.get("node_count", self.joined)) or 0)
            elif kind == "error" and self.error is None:
                self.error = str(ev.get("reason") or "the Ray bootstrap failed")
                self.error_log = _log_text(ev.get("log"))
            elif kind == "walltime_warning":
                self.walltime_warning = True
            elif kind == "lease_stale":
                self.lease_stale = True
            elif kind == "node_lost" and self.node_lost is None:
                self.node_lost = str(ev.get("reason") or ev.get("host") or "a node")
            elif kind == "stopped":
                self.stopped = True


def _log_text(log: Any) -> str:
    """An event's ``log`` as text: the bootstrap writes a list of lines."""
    if isinstance(log, (list, tuple)):
        return "\n".join(str(line) for line in log)
    return str(log or "")


def derive_status(
    previous: Status,
    job: JobInfo | None,
    events: EventSummary,
    *,
    connected: bool = False,
    stopping: bool = False,
    log_tail: str = "",
    job_forgotten: bool = False,
) -> Status:
    """The new status given Slurm's job info and the bootstrap's events.

    ``job_forgotten``: Slurm no longer lists the job and keeps no accounting of it.
    """
    if previous.state.is_final:
        return previous
    base = replace(
        previous,
        at=time.time(),
        phase=events.phase,
        nodes_joined=events.joined,
        walltime_warning=events.walltime_warning,
    )
    if job is not None:
        base = replace(
            base,
            job_id=job.job_id,
            nodes=job.nodes or base.nodes,
            time_left=job.time_left,
            time_limit=job.time_limit or base.time_limit,
        )
    if job is None and job_forgotten:
        reason = "Slurm no longer knows the job and keeps no accounting: it has ended"
        return replace(base, state=State.STOPPED, reason=reason)
    if job is None:
        return base
    if job.is_final:
        return _final_status(base, job, events, stopping, log_tail)
    if events.error:
        return replace(base, state=State.FAILED, reason=events.error, log_tail=events.error_log)
    if stopping:
        return replace(base, state=State.STOPPING, reason=None)
    if job.is_pending:
        return replace(base, state=State.PENDING, reason=job.reason, estimated_start=job.start_time)
    if events.ready:
        state = State.CONNECTED if connected else State.READY
        return replace(base, state=state, reason=None, nodes_joined=base.nodes_wanted)
    return replace(base, state=State.STARTING, reason=None, phase=events.phase or "job started")


def _final_status(
    base: Status, job: JobInfo, events: EventSummary, stopping: bool, log_tail: str
) -> Status:
    if events.error:
        return replace(base, state=State.FAILED, reason=events.error, log_tail=events.error_log)
    if stopping and job.state in ("CANCELLED", "COMPLETED"):
        return replace(base, state=State.STOPPED, reason="stopped on request")
    if job.state in _SLURM_FINAL:
        state = _SLURM_FINAL[job.state]
        if state is State.STOPPED:
            reason = (
                "the owner's lease went stale (owner gone)"
                if events.lease_stale
                else "the Ray bootstrap exited"
            )
            return replace(base, state=state, reason=reason)
        reason = {
            State.CANCELLED: "the Slurm job was cancelled",
            State.TIMEOUT: "the walltime was reached",
            State.PREEMPTED: "the job was preempted",
            State.NODE_FAIL: "a node failed",
        }[state]
        return replace(base, state=state, reason=reason)
    exit_info = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    reason = f"the Slurm job ended {job.state}{exit_info}"
    if job.state == "OUT_OF_MEMORY":
        reason = "the job ran out of memory"
    return replace(base, state=State.FAILED, reason=reason, log_tail=log_tail)
