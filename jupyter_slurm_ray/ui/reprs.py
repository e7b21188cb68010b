"""How a cluster looks in a notebook: its status line and its rich repr (state, queue insight,
walltime, nodes, owner, request, usage). The pieces it shares with the live view (badges,
dashboard links, a status's line) are ``formatting.py``'s."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..slurm.queueinfo import QueueInsight, queue_insight
from ..slurm.usage import cached_usage
from ..slurm.walltime import warning_due
from ..states import Status
from .formatting import (
    badge_html,
    connection_text,
    dashboard_links,
    format_duration,
    scaling_text,
    spec_status_line,
    usage_summary,
)

if TYPE_CHECKING:
    from ..cluster import SlurmRayCluster

__all__ = [
    "cluster_line",
    "cluster_mimebundle",
    "cluster_queue",
]


def cluster_queue(cluster: SlurmRayCluster, status: Status | None = None) -> QueueInsight | None:
    """Why the cluster waits in the queue, in plain words (None unless PENDING)."""
    status = status or cluster.status
    return queue_insight(status, partition=cluster.spec.partition, nodes=cluster.spec.nodes)


def cluster_line(
    cluster: SlurmRayCluster, *, since: float | None = None, status: Status | None = None
) -> str:
    """The cluster's status line (now, or ``status``), with the queue insight if PENDING."""
    return spec_status_line(status or cluster.status, cluster.spec, since=since)


def _walltime(cluster: SlurmRayCluster) -> str | None:
    status, spec = cluster.status, cluster.spec
    left = status.walltime_left()
    if left is None or status.state.is_final:
        return None
    text = f"{format_duration(left)} left of {format_duration(status.time_limit)}"
    if warning_due(status, spec.walltime_warning):
        return text + f" · almost over: `%slurm_ray extend {spec.name} +30` asks for more"
    return text + f" (warned {format_duration(spec.walltime_warning)} before the end)"


def _rows(cluster: SlurmRayCluster) -> Iterable[tuple[str, str]]:
    status, spec = cluster.status, cluster.spec
    yield "state", cluster_line(cluster)
    queue = cluster_queue(cluster)
    if queue is not None:
        yield "queue", queue.meaning + (f"; {queue.hint}" if queue.hint else "")
        if queue.action:
            yield "what to do", queue.action
    walltime = _walltime(cluster)
    if walltime:
        yield "walltime", walltime
    yield (
        "nodes",
        f"{status.nodes_joined}/{status.nodes_wanted} joined"
        + (f" ({', '.join(status.nodes)})" if status.nodes else ""),
    )
    yield from _scaling_rows(status)
    if status.job_id and not status.state.is_final:
        yield "owner", cluster.ownership.describe()
    connection = connection_text(status)
    if connection:
        yield "connected as", connection
    request = [f"{spec.nodes} × {spec.cpus_per_node or 'default'} CPU"]
    if spec.gpus_per_node:
        request.append(f"{spec.gpus_per_node} GPU per node")
    request.append(f"walltime {spec.time}")
    if spec.partition:
        request.append(f"partition {spec.partition}")
    if spec.account:
        request.append(f"account {spec.account}")
    if spec.qos:
        request.append(f"QOS {spec.qos}")
    yield "request", ", ".join(request)
    usage = cached_usage(cluster.transport, [status.job_id]) if status.job_id else None
    if usage is not None:
        yield "usage", usage_summary(usage)
    yield "cluster id", cluster.id


def _scaling_rows(status: Status) -> Iterable[tuple[str, str]]:
    """Worker jobs (alive / wanted / pending with Slurm's reason and estimated start) and the
    adaptive policy's settings and last decisions (issue 9, item 6)."""
    summary = scaling_text(status)
    if summary:
        yield "worker jobs", summary
        for job in status.worker_jobs_pending:
            yield "", job.describe()
    for i, line in enumerate(status.scaling):
        yield ("adaptive" if i == 0 else ""), line


def cluster_mimebundle(
    cluster: SlurmRayCluster, include: Any = None, exclude: Any = None
) -> dict[str, str]:
    """text/plain and text/html of a cluster, for ``SlurmRayCluster._repr_mimebundle_``."""
    rows = list(_rows(cluster))
    links = dashboard_links(cluster.id, cluster.dashboard_url)
    if links:
        rows.append(("dashboard", links.get("proxied") or links["direct"]))
    title = f"SlurmRayCluster {cluster.spec.name}"
    text = "\n".join([title, *(f"  {key:<10} {value}" for key, value in rows)])
    cells = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(key)}</th>"
        f"<td style='text-align:left'>{_html_value(key, value)}</td></tr>"
        for key, value in rows
    )
    markup = (
        f"<div><b>{html.escape(title)}</b> {badge_html(cluster.state)}"
        f"<table style='margin-top:4px'>{cells}</table></div>"
    )
    return {"text/plain": text, "text/html": markup}


def _html_value(key: str, value: str) -> str:
    if key == "dashboard":
        url = html.escape(value, quote=True)
        return f'<a href="{url}" target="_blank" rel="noopener">{url}</a>'
    return html.escape(value)
