"""Cluster states and how Slurm's view of the job plus the bootstrap's events map onto them.

Pure logic: ``derive_status`` takes what Slurm says (``JobInfo``) and what the bootstrap wrote
(``events.jsonl``) and returns the one truthful ``Status`` that every view shows.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from .bootstrap.jsr_wire import WORKER_JOB_FIELD, Event, Role
from .scheduler.records import JobInfo


class State(str, enum.Enum):
    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    STARTING = "STARTING"
    READY = "READY"
    CONNECTED = "CONNECTED"
    # up, but Ray cannot do all it should (ports of a node taken by another user): the reason
    DEGRADED = "DEGRADED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  # the kernel killed Ray at the job's memory limit

    @property
    def is_final(self) -> bool:
        return self in FINAL

    @property
    def is_up(self) -> bool:
        return self in UP

    def __str__(self) -> str:
        return self.value


#: up: Ray runs (the labextension's copy of these groups: labextension/src/states.ts)
UP = frozenset({State.READY, State.CONNECTED, State.DEGRADED})
FINAL = frozenset(
    {
        State.STOPPED,
        State.FAILED,
        State.TIMEOUT,
        State.CANCELLED,
        State.PREEMPTED,
        State.NODE_FAIL,
        State.OUT_OF_MEMORY,
    }
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
    "OUT_OF_MEMORY": State.OUT_OF_MEMORY,
}


@dataclass(frozen=True)
class WorkerJobStatus:
    """One extra worker job of the cluster (scaling): Slurm's state and reason, its node."""

    job_id: str
    state: str  # Slurm's: PENDING, RUNNING, ...
    reason: str | None = None  # Slurm's pending reason, or why it ended
    host: str | None = None
    joined: bool = False  # its Ray node joined the head
    estimated_start: str | None = None  # Slurm's estimate while PENDING
    group: str = "default"  # its worker group

    def describe(self) -> str:
        if self.state == "PENDING":
            start = f", est. start {self.estimated_start}" if self.estimated_start else ""
            return f"job {self.job_id} PENDING ({self.reason or 'no reason yet'}){start}"
        where = f" on {self.host}" if self.host else ""
        joined = ", joined" if self.joined else ", joining" if self.state == "RUNNING" else ""
        return f"job {self.job_id} {self.state}{where}{joined}"


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
    nodes_lost: tuple[str, ...] = ()
    # Since when Slurm has not answered (time.time()); the state is then the last known one.
    slurm_unreachable_since: float | None = None
    # A transient problem worth showing (why Slurm did not answer, a watcher error).
    notice: str | None = None
    # The extra worker jobs (scaling) Slurm may still run; nodes_wanted counts those wanted.
    worker_jobs: tuple[WorkerJobStatus, ...] = ()
    # Adaptive scaling (elastic/adapt.py): its settings, a failure, its last decisions with their
    # cause.
    scaling: tuple[str, ...] = ()
    # Who owns the cluster when this process does not (ownership.py): "observing; owned by
    # pid N on host", "taken over: owned by …"; None for the owner.
    ownership: str | None = None
    # How the connected process connects (client/mode.py): "driver" or "client", and why.
    connect_mode: str | None = None
    connect_reason: str | None = None

    @property
    def worker_jobs_pending(self) -> tuple[WorkerJobStatus, ...]:
        return tuple(job for job in self.worker_jobs if job.state == "PENDING")

    def same_as(self, other: Status | None) -> bool:
        """Equal in everything a viewer would notice (the timestamp and the walltime left,
        which change on every poll, excluded)."""
        if other is None:
            return False
        return all(getattr(self, k) == getattr(other, k) for k in _COMPARED)

    def walltime_left(self, now: float | None = None) -> float | None:
        """Seconds of walltime left now, counted down from Slurm's last answer."""
        if self.time_left is None:
            return None
        now = time.time() if now is None else now
        return max(0.0, self.time_left - (now - self.at))

    def brief(self) -> str:
        """The state, its reason, the job and who owns it when this process does not, for
        messages: ``PENDING (Resources) · job 12`` (the whole line a person reads is
        ``ui.formatting.status_line``)."""
        parts = [f"{self.state.value} ({self.reason})" if self.reason else self.state.value]
        if self.job_id:
            parts.append(f"job {self.job_id}")
        if self.ownership and not self.state.is_final:
            parts.append(self.ownership)
        return " · ".join(parts)


_COMPARED = tuple(f.name for f in fields(Status) if f.name not in ("at", "time_left", "time_limit"))


def status_of_record(record: Any) -> Status:
    """The status a registry record last saw (``record`` is a ``registry.ClusterRecord``)."""
    return Status(
        State(record.state),
        at=record.updated_at,
        reason=record.reason,
        phase=record.phase,
        nodes_joined=record.nodes_joined,
        nodes_wanted=record.nodes_wanted,
        nodes_lost=tuple(record.nodes_lost),
        job_id=record.job_id,
        time_limit=record.time_limit,
        time_left=record.time_left,
        slurm_unreachable_since=record.slurm_unreachable_since,
        scaling=tuple(line for line in record.scaling if isinstance(line, str)),
        connect_mode=record.connect_mode,
        connect_reason=record.connect_reason,
        worker_jobs=tuple(
            WorkerJobStatus(
                str(job.get("job_id")),
                str(job.get("state")),
                job.get("reason"),
                job.get("host"),
                bool(job.get("joined")),
                job.get("estimated_start"),
                group=str(job.get("group") or "default"),
            )
            for job in record.worker_jobs
            if isinstance(job, Mapping) and job.get("state") not in WORKER_ENDED
        ),
    )


#: Slurm's final states of a worker job, and ENDED: Slurm forgot it.
WORKER_ENDED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
    | {"DEADLINE", "OUT_OF_MEMORY", "ENDED"}
)


def record_fields(status: Status) -> dict[str, Any]:
    """The fields of a registry record that keep ``status`` (the inverse of the above)."""
    return {
        "job_id": status.job_id,
        "state": status.state.value,
        "reason": status.reason,
        "phase": status.phase,
        "nodes_joined": status.nodes_joined,
        "nodes_lost": list(status.nodes_lost),
        "time_limit": status.time_limit,
        "time_left": status.time_left,
        "slurm_unreachable_since": status.slurm_unreachable_since,
        "scaling": list(status.scaling),
        "connect_mode": status.connect_mode,
        "connect_reason": status.connect_reason,
    }


@dataclass
class EventSummary:
    """What the bootstrap's events.jsonl says so far."""

    phase: str | None = None
    joined: int = 0
    ready: bool = False  # every node joined
    head_ready: bool = False  # the head answers: clients may connect while workers join
    error: str | None = None
    error_log: str = ""
    walltime_warning: bool = False
    lease_stale: bool = False
    owner_gone: str | None = None  # the owner was gone when the job started: Ray never ran
    stopped: bool = False
    stop_requested: str | None = None  # a client stopped it (who): its CANCELLED is STOPPED
    nodes_lost: list[str] = field(default_factory=list)
    ports_taken: dict[str, str] = field(default_factory=dict)  # host -> what is taken, by whom
    out_of_memory: str | None = None  # the last memory kill told (out_of_memory events)
    out_of_memory_fatal: bool = False  # ... and it ended Ray
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        for ev in events:
            self.events.append(ev)
            kind = ev.get("event")
            if kind in (Event.PORTS_TAKEN, Event.PORTS_FREED):  # any node's, a worker job's too
                self._note_ports(ev)
                continue
            if kind == Event.OUT_OF_MEMORY:  # any node's
                self.out_of_memory = str(ev.get("reason") or "out of memory")
                self.out_of_memory_fatal = self.out_of_memory_fatal or bool(ev.get("fatal"))
                continue
            if ev.get(WORKER_JOB_FIELD):  # an extra worker job's own: not the cluster's state
                continue
            if kind == Event.PHASE:
                self.phase = ev.get("phase", self.phase)
                self.joined = int(ev.get("joined", self.joined) or 0)
            elif kind == Event.NODES:
                self.joined = int(ev.get("joined", self.joined) or 0)
            elif kind == Event.HEAD_READY:
                self.head_ready = True
                self.joined = int(ev.get("joined", self.joined) or 0)
            elif kind == Event.READY:
                self.ready = True
                self.joined = int(ev.get("joined", ev.get("node_count", self.joined)) or 0)
            elif kind == Event.ERROR and self.error is None:
                self.error = str(ev.get("reason") or "the Ray bootstrap failed")
                self.error_log = _log_text(ev.get("log"))
            elif kind == Event.WALLTIME_WARNING:
                self.walltime_warning = True
            elif kind == Event.LEASE_STALE:
                self.lease_stale = True
            elif kind == Event.OWNER_GONE:
                self.owner_gone = str(ev.get("reason") or "the owner was gone when the job started")
            elif kind == Event.NODE_LOST:
                self._add_lost(ev)
            elif kind == Event.STOPPED:
                self.stopped = True
            elif kind == Event.STOP_REQUESTED and ev.get("role") == Role.CLIENT:
                # written by whoever stops the cluster, before its scancel: Slurm's
                # CANCELLED is then a stop on request (STOPPED), not an outside scancel
                self.stop_requested = f"by pid {ev.get('pid')} on {ev.get('host')}"

    @property
    def degraded(self) -> str | None:
        """Why Ray cannot do all it should now (None: nothing known)."""
        return "; ".join(self.ports_taken[host] for host in sorted(self.ports_taken)) or None

    def _note_ports(self, event: dict[str, Any]) -> None:
        host = str(event.get("host") or event.get("ip") or "a node")
        if event.get("event") == Event.PORTS_FREED:
            self.ports_taken.pop(host, None)
            return
        ports = event.get("ports")
        taken = len(ports) if isinstance(ports, list) else "some"
        by = ", ".join(str(who) for who in event.get("by") or []) or "another user"
        self.ports_taken[host] = (
            f"{taken} of the {event.get('of', '?')} ports of {host}'s block taken by {by}: "
            "Ray cannot start workers on them"
        )

    def _add_lost(self, event: dict[str, Any]) -> None:
        hosts = event.get("hosts") or [event.get("host")]
        if not isinstance(hosts, list):
            hosts = [hosts]
        for host in hosts:
            if isinstance(host, str) and host and host not in self.nodes_lost:
                self.nodes_lost.append(host)
        if isinstance(event.get("joined"), int):
            self.joined = event["joined"]


def _log_text(log: Any) -> str:
    """An event's ``log`` as text: the bootstrap writes a list of lines."""
    if isinstance(log, (list, tuple)):
        return "\n".join(str(line) for line in log)
    return str(log or "")


def last_known_job(status: Status) -> JobInfo:
    """Slurm's last known view of the job, re-derived from a status (when Slurm gave no news,
    or the change comes from our side: connected, stopping)."""
    slurm_state = {
        State.PENDING: "PENDING",
        State.SUBMITTING: "PENDING",
    }.get(status.state, "RUNNING")
    return JobInfo(
        job_id=status.job_id or "",
        state=slurm_state,
        reason=status.reason if status.state is State.PENDING else None,
        nodes=status.nodes,
        start_time=status.estimated_start,
        time_left=status.time_left,
        time_limit=status.time_limit,
    )


def derive_status(
    previous: Status,
    job: JobInfo | None,
    events: EventSummary,
    *,
    connected: bool = False,
    stopping: bool = False,
    log_tail: str = "",
    job_forgotten: bool = False,
    node_reasons: Mapping[str, str] | None = None,
) -> Status:
    """The new status given Slurm's job info and the bootstrap's events.

    ``job`` None means "no news from Slurm" (the last known job state stands), except with
    ``job_forgotten``: Slurm answered, several times, that it does not know the job and keeps
    no accounting of it. ``node_reasons``: Slurm's reason per down node, for NODE_FAIL.
    """
    if previous.state.is_final:
        return previous
    base = replace(
        previous,
        at=time.time(),
        phase=events.phase,
        nodes_joined=events.joined,
        nodes_lost=tuple(events.nodes_lost),
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
        return replace(base, state=State.STOPPED, reason=events.owner_gone or reason)
    if job is None:
        return base
    if job.is_final:
        return _final_status(base, job, events, stopping, log_tail, node_reasons or {})
    if events.error:
        return replace(base, state=_failed(events), reason=events.error, log_tail=events.error_log)
    if stopping:
        return replace(base, state=State.STOPPING, reason=None)
    if job.is_pending:
        return replace(base, state=State.PENDING, reason=job.reason, estimated_start=job.start_time)
    lost = _lost_text(events.nodes_lost)
    if events.ready and events.degraded:  # never shown CONNECTED while Ray is starved
        reasons = [events.degraded, events.out_of_memory, lost]
        return replace(base, state=State.DEGRADED, reason="; ".join(filter(None, reasons)))
    if events.ready:
        state = State.CONNECTED if connected else State.READY
        told = "; ".join(filter(None, [events.out_of_memory, lost])) or None
        return replace(base, state=state, reason=told)
    if events.head_ready and connected:  # connected to the head while the workers join
        joining = f"{base.nodes_joined}/{base.nodes_wanted} nodes joined"
        return replace(base, state=State.CONNECTED, reason=joining)
    return replace(base, state=State.STARTING, reason=None, phase=events.phase or "job started")


def _failed(events: EventSummary) -> State:
    """FAILED, or OUT_OF_MEMORY when the kernel killed Ray at the job's memory limit."""
    return State.OUT_OF_MEMORY if events.out_of_memory_fatal else State.FAILED


def _lost_text(hosts: list[str]) -> str | None:
    return f"{', '.join(hosts)} lost" if hosts else None


def _final_status(
    base: Status,
    job: JobInfo,
    events: EventSummary,
    stopping: bool,
    log_tail: str,
    node_reasons: Mapping[str, str],
) -> Status:
    if events.error or (job.state == "OUT_OF_MEMORY" and events.out_of_memory_fatal):
        reason = events.error or events.out_of_memory or "out of memory"
        state = State.OUT_OF_MEMORY if job.state == "OUT_OF_MEMORY" else _failed(events)
        return replace(base, state=state, reason=reason, log_tail=events.error_log)
    if stopping and job.state in ("CANCELLED", "COMPLETED"):
        return replace(base, state=State.STOPPED, reason=_stopped("stopped on request", events))
    if events.stop_requested and job.state in ("CANCELLED", "COMPLETED"):
        stopped = _stopped(f"stopped {events.stop_requested}", events)
        return replace(base, state=State.STOPPED, reason=stopped)
    if job.state in _SLURM_FINAL:
        state = _SLURM_FINAL[job.state]
        return replace(base, state=state, reason=_final_reason(state, job, events, node_reasons))
    exit_info = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    reason = f"the Slurm job ended {job.state}{exit_info}"
    return replace(base, state=State.FAILED, reason=reason, log_tail=log_tail)


def _stopped(reason: str, events: EventSummary) -> str:
    """A stop's reason, and a memory kill of the cluster's life (it went on after it)."""
    return f"{reason}; earlier, {events.out_of_memory}" if events.out_of_memory else reason


def _final_reason(
    state: State, job: JobInfo, events: EventSummary, node_reasons: Mapping[str, str]
) -> str:
    if state is State.STOPPED:
        if events.owner_gone:
            return events.owner_gone
        if events.lease_stale:
            return "the owner's lease went stale (owner gone)"
        return "the Ray bootstrap exited"
    if state is State.NODE_FAIL:
        failed = {h: r for h, r in node_reasons.items() if not job.nodes or h in job.nodes}
        if failed:
            return "; ".join(
                f"{host} failed: {why or 'no reason given'}" for host, why in failed.items()
            )
        why = f" ({job.reason})" if job.reason else ""
        return f"a node failed{why}" + (f" among {', '.join(job.nodes)}" if job.nodes else "")
    if state is State.OUT_OF_MEMORY:
        return events.out_of_memory or (
            "the job ran out of memory (Slurm: OUT_OF_MEMORY): the kernel killed a process at "
            "its memory limit; ask for more with --mem (mem_per_node)"
        )
    return {
        State.CANCELLED: "the Slurm job was cancelled",
        State.TIMEOUT: "the walltime was reached",
        State.PREEMPTED: "the job was preempted",
    }[state]
