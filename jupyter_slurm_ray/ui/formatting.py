"""How durations, sizes, statuses and usage read for humans: one formatter for every view of a
cluster (the magics, the panel, the reprs, the live view, the CLI), with the state's badge and
the dashboard's links. Values in, words out: nothing here reads a cluster object."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..inventory import Entry
from ..naming import DASHBOARD_BASE_ENV
from ..slurm.queueinfo import QueueInsight, queue_insight
from ..slurm.walltime import warning_due
from ..states import State, Status, WorkerJobStatus

if TYPE_CHECKING:
    from ..slurm.usage import Usage
    from ..spec import ClusterSpec

__all__ = [
    "badge_html",
    "connection_text",
    "dashboard_links",
    "extension_line",
    "format_bytes",
    "format_duration",
    "format_table",
    "scaling_text",
    "spec_status_line",
    "status_line",
    "usage_summary",
    "walltime_warning_line",
]


def format_duration(seconds: float | None) -> str:
    """``3725`` → ``"1:02:05"``; days as ``"2-03:04:05"``; ``"?"`` when unknown."""
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hours:02d}:{rest // 60:02d}:{rest % 60:02d}" if days else clock


def format_bytes(size: float | None) -> str:
    """``1288490188`` → ``"1.2 GiB"``; ``"?"`` when unknown."""
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def status_line(
    status: Status,
    *,
    since: float | None = None,
    now: float | None = None,
    queue: QueueInsight | None = None,
    warning: bool | None = None,
) -> str:
    """One line: state, Slurm's reason (in plain words with ``queue``) or start-up phase,
    est. start, elapsed, time left, whether the walltime is almost over (``warning``, else
    the job's own event), and who owns it when this process does not."""
    now = time.time() if now is None else now
    parts = [status.state.value]
    if status.state is State.STARTING:
        joined = f"{status.nodes_joined}/{status.nodes_wanted} nodes"
        parts.append(f"({status.phase or 'starting'}, {joined})")
    elif queue is not None and status.state is State.PENDING:
        parts.append(f"({queue.short()})")
    elif status.reason:
        parts.append(f"({status.reason})")
    if status.job_id:
        parts.append(f"job {status.job_id}")
    scaling = scaling_text(status)
    if scaling:
        parts.append(scaling)
    if queue is not None and queue.hint and status.state is State.PENDING:
        parts.append(queue.hint)
    if status.state is State.PENDING and status.estimated_start:
        parts.append(f"est. start {status.estimated_start:%Y-%m-%d %H:%M}")
    if since is not None and not status.state.is_final:
        parts.append(f"elapsed {format_duration(now - since)}")
    left = status.walltime_left(now)
    if left is not None and (status.state.is_up or status.state is State.STARTING):
        parts.append(f"{format_duration(left)} left")
    warned = status.walltime_warning if warning is None else warning
    if warned and not status.state.is_final:
        parts.append("walltime almost over")
    if status.slurm_unreachable_since is not None and not status.state.is_final:
        silent = format_duration(now - status.slurm_unreachable_since)
        parts.append(f"Slurm not answering for {silent} (last known state shown)")
    elif status.notice and not status.state.is_final:
        parts.append(status.notice)
    if status.ownership and not status.state.is_final:
        parts.append(status.ownership)
    connection = connection_text(status)
    if connection:
        parts.append(connection)
    return " · ".join(parts)


def connection_text(status: Status) -> str | None:
    """``Ray driver (auto: …)`` or ``Ray Client (…)`` while connected, else None."""
    if status.state is not State.CONNECTED or not status.connect_mode:
        return None
    label = "Ray driver" if status.connect_mode == "driver" else "Ray Client"
    return f"{label} ({status.connect_reason})" if status.connect_reason else label


def scaling_text(status: Status) -> str | None:
    """A scaled cluster's nodes: ``3/4 nodes alive, worker jobs: 2 running, 1 pending
    (Resources)``, by group when it has others than the default (``…, worker jobs: default:
    1 running; gpu: 1 pending (Resources)``); None for a cluster without worker jobs."""
    jobs = status.worker_jobs
    if not jobs or status.state.is_final:
        return None
    alive = f"{status.nodes_joined}/{status.nodes_wanted} nodes alive"
    groups = sorted({job.group for job in jobs}, key=lambda name: (name != "default", name))
    if groups == ["default"]:
        return f"{alive}, worker jobs: {_jobs_text(jobs)}"
    parts = [f"{g}: {_jobs_text([j for j in jobs if j.group == g])}" for g in groups]
    return f"{alive}, worker jobs: " + "; ".join(parts)


def _jobs_text(jobs: Sequence[WorkerJobStatus]) -> str:
    """``2 running, 1 pending (Resources)``."""
    pending = [job for job in jobs if job.state == "PENDING"]
    reasons = sorted({job.reason or "no reason yet" for job in pending})
    waiting = f", {len(pending)} pending ({', '.join(reasons)})" if pending else ""
    return f"{len(jobs) - len(pending)} running{waiting}"


def usage_summary(usage: Usage) -> str:
    """``used 0.1 CPU-hours, 0 GPU-hours, CPU efficiency 34 %, max RSS 1.2 GiB on node1``,
    or what is unavailable and why."""
    if not usage.available:
        return f"usage unavailable: {usage.unavailable}"
    parts = [f"used {_hours(usage.cpu_hours)} CPU-hours", f"{_hours(usage.gpu_hours)} GPU-hours"]
    efficiency = usage.cpu_efficiency
    if efficiency is not None:
        parts.append(f"CPU efficiency {efficiency * 100:.0f} %")
    peak = usage.max_rss
    if peak is not None:
        parts.append(f"max RSS {format_bytes(peak[1])} on {peak[0]}")
    if not usage.final:
        parts.append(
            f"in {format_duration(usage.elapsed)} so far (efficiency and memory when it ends)"
        )
    elif efficiency is None or peak is None:
        missing = [w for w, v in (("CPU efficiency", efficiency), ("max RSS", peak)) if v is None]
        parts.append(f"{' and '.join(missing)} not recorded by Slurm")
    return ", ".join(parts)


def _hours(hours: float) -> str:
    """``0``, ``0.01``, ``0.1``, ``12.3``: two significant figures below 10."""
    if hours == 0:
        return "0"
    if hours >= 10:
        return f"{hours:.1f}"
    return f"{hours:.2g}"


def walltime_warning_line(name: str, status: Status, now: float | None = None) -> str:
    """The one line a notebook prints when a cluster's walltime is almost over."""
    left = format_duration(status.walltime_left(now))
    job = f" (job {status.job_id})" if status.job_id else ""
    return (
        f"⚠ {name}{job}: walltime almost over, {left} left. Save your work; "
        f"`%slurm_ray extend {name} +30` asks Slurm for 30 more minutes."
    )


def extension_line(name: str, minutes: int, time_left: int | None, time_limit: int | None) -> str:
    """``ray: walltime extended by 30 min: 0:39:58 left (time limit 0:40:00)``."""
    return (
        f"{name}: walltime extended by {minutes} min: {format_duration(time_left)} left "
        f"(time limit {format_duration(time_limit)})"
    )


_COLOURS = {
    State.SUBMITTING: "#6c757d",
    State.PENDING: "#b8860b",
    State.STARTING: "#1f6feb",
    State.READY: "#2e7d32",
    State.CONNECTED: "#2e7d32",
    State.DEGRADED: "#e65100",
    State.STOPPING: "#6c757d",
    State.STOPPED: "#6c757d",
}
_FAILURE_COLOUR = "#c62828"


def badge_html(state: State) -> str:
    colour = _COLOURS.get(state, _FAILURE_COLOUR)
    return (
        f'<span style="background:{colour};color:white;border-radius:4px;padding:1px 6px;'
        f'font-family:monospace;font-size:90%">{state.value}</span>'
    )


def dashboard_links(cluster_id: str, dashboard_url: str | None) -> dict[str, str]:
    """``{"proxied": …, "direct": …}``: the dashboard through Jupyter (behind its login) when
    this kernel's server runs the extension, and the address on the cluster network."""
    links = {}
    base = os.environ.get(DASHBOARD_BASE_ENV)
    if base:
        links["proxied"] = f"{base.rstrip('/')}/{cluster_id}/"
    if dashboard_url:
        links["direct"] = dashboard_url
    return links


def spec_status_line(status: Status, spec: ClusterSpec, *, since: float | None = None) -> str:
    """The status line of a cluster of ``spec``, with the queue insight if PENDING and the
    walltime warning when due."""
    queue = queue_insight(status, partition=spec.partition, nodes=spec.nodes)
    warning = warning_due(status, spec.walltime_warning)
    return status_line(status, since=since, queue=queue, warning=warning)


# -- the list of clusters (`%slurm_ray list`, `jupyter slurm-ray list`) ---------------------
def format_table(entries: Sequence[Entry], *, ended: bool = False) -> str:
    """A plain-text table: live clusters first; the ended ones folded into one line (``ended``:
    listed under them, as "recent")."""
    if not entries:
        return "no clusters"
    live = [e for e in entries if e.record is None or not e.status.state.is_final]
    gone = [e for e in entries if e not in live]
    lines = [_rows(live)] if live else ["no live clusters"]
    if gone and ended:
        lines += ["", f"recent ({len(gone)} ended):", _rows(gone)]
    elif gone:
        lines.append(f"recent: {len(gone)} ended (list --all shows them)")
    return "\n".join(lines)


def _rows(entries: Sequence[Entry]) -> str:
    header = ("NAME", "ID", "JOB", "STATE", "NODES", "OWNER", "WHERE")
    rows = [header]
    notes = []
    for e in entries:
        r = e.record
        if r is None:
            rows.append(("?", e.id, "-", e.state, "-", "?", "-"))
            notes.append(f"{e.id}: unreadable record: {e.error}")
            continue
        nodes = f"{e.status.nodes_joined}/{r.nodes_wanted}"
        state = e.state + (" (Slurm silent)" if e.status.slurm_unreachable_since else "")
        rows.append((r.name, r.id, r.job_id or "-", state, nodes, e.owner, r.target))
        if e.error:
            notes.append(f"{e.id}: {e.error}")
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    table = "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
    return "\n".join([table, *notes])
