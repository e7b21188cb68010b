"""Live status of one cluster: a compact ipywidgets view in notebooks, printed lines elsewhere.

Both are driven by the cluster's observers (called on the background loop thread); nothing in the
browser polls. A ticker on the same loop refreshes the elapsed time and the walltime left.
``Notices`` adds the one-off lines: the walltime warning (once per cluster) and, when the
cluster ends, what it used (one ``sacct``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import html
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import ipywidgets as widgets
from traitlets import Unicode

from ..aio import background_loop
from ..slurm.usage import Usage, fetch_usage
from ..slurm.walltime import warning_due
from ..states import Status
from .formatting import (
    badge_html,
    dashboard_links,
    spec_status_line,
    status_line,
    usage_summary,
    walltime_warning_line,
)

if TYPE_CHECKING:
    from ..cluster import SlurmRayCluster

log = logging.getLogger(__name__)

__all__ = ["Notices", "StatusView", "TextProgress", "frontend_has_widgets"]


def frontend_has_widgets() -> bool:
    """True inside a Jupyter kernel (whose frontend can render widgets), not in a terminal."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress_bar(what: str, total: int) -> Callable[[int, int], None] | None:
    """A progress bar in a notebook (a long transfer, e.g. an environment pack sent to the
    cluster; ``display.progress``), None elsewhere."""
    if not frontend_has_widgets():
        return None
    from IPython.display import display

    bar = widgets.FloatProgress(value=0, min=0, max=max(total, 1), description="pack")
    label = widgets.Label(what)
    display(widgets.HBox([bar, label]))

    def update(done: int, _total: int) -> None:
        bar.value = done
        label.value = f"{what}: {done / 1e6:.0f} / {total / 1e6:.0f} MB"

    return update


def _since(cluster: SlurmRayCluster) -> float:
    return cluster.history[0].at if cluster.history else cluster.status.at


class Notices:
    """One-off lines about a cluster, each given to ``emit`` once: the walltime warning, and
    when the cluster ends, what it used (``used 0.1 CPU-hours, …``)."""

    def __init__(self, cluster: SlurmRayCluster, emit: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.emit = emit
        self.warned = False
        self.summarised = False
        self.summary: concurrent.futures.Future[None] | None = None
        cluster.add_observer(self.check)
        self.check(cluster.status)

    def check(self, status: Status) -> None:
        """Called on every state change (and by the view's ticker, as the time left shrinks)."""
        cluster = self.cluster
        if not self.warned and warning_due(status, cluster.spec.walltime_warning):
            self.warned = True
            self.emit(walltime_warning_line(cluster.spec.name, status))
        if status.state.is_final and status.job_id and not self.summarised:
            self.summarised = True
            self.summary = asyncio.run_coroutine_threadsafe(
                self._summarise(status), background_loop()
            )

    async def _summarise(self, status: Status) -> None:
        try:
            jobs = self.cluster.slurm_job_ids() or [status.job_id or ""]  # worker jobs too
            usage = await settled_usage(self.cluster, jobs)
            self.emit(f"{self.cluster.spec.name} ({status.state.value}): {usage_summary(usage)}")
        except Exception:  # a summary is a courtesy; the kernel must go on
            log.exception("summarising the usage of %s failed", self.cluster.id)

    def close(self) -> None:
        self.cluster.remove_observer(self.check)


async def settled_usage(
    cluster: SlurmRayCluster, job_ids: list[str], attempts: int = 8, pause: float = 2.0
) -> Usage:
    """What the cluster's jobs (the head's and its worker jobs', as ``cluster.usage`` counts
    them) used, once accounting has recorded their end (slurmdbd may lag a little)."""
    usage = await fetch_usage(cluster.transport, job_ids, max_age=0)
    for _ in range(attempts - 1):
        waiting = usage.available and not usage.final
        if not (waiting or usage.unrecorded):
            break
        await asyncio.sleep(pause)
        usage = await fetch_usage(cluster.transport, job_ids, max_age=0)
    return usage


class StatusView(widgets.VBox):
    """State badge, status line, nodes-joined bar and dashboard link of one cluster, and its
    one-off notices (walltime warning, usage at the end)."""

    state = Unicode("", help="The state shown now (not synced; for observers and tests).")

    def __init__(self, cluster: SlurmRayCluster | None = None, **kwargs: Any) -> None:
        self.badge = widgets.HTML()
        self.line = widgets.HTML()
        self.progress = widgets.IntProgress(
            min=0, max=1, description="nodes", layout=widgets.Layout(width="260px")
        )
        self.link = widgets.HTML()
        self.notes = widgets.HTML()
        top = widgets.HBox([self.badge, self.progress, self.line])
        super().__init__([top, self.link, self.notes], **kwargs)
        self.cluster: SlurmRayCluster | None = None
        self.notices: Notices | None = None
        self._ticker: concurrent.futures.Future[None] | None = None
        self.history: list[str] = []  # every state shown, in order
        self.noted: list[str] = []  # every notice shown, in order
        if cluster is not None:
            self.bind(cluster)

    def bind(self, cluster: SlurmRayCluster) -> None:
        """Show ``cluster`` from now on (the panel binds a new cluster after each Up)."""
        self.unbind()
        self.cluster = cluster
        cluster.add_observer(self._on_status)
        self.render(cluster.status)
        self.notes.value = ""
        self.noted = []
        self.notices = Notices(cluster, self.note)
        self._ticker = asyncio.run_coroutine_threadsafe(self._tick(cluster), background_loop())

    def unbind(self) -> None:
        if self.cluster is not None:
            self.cluster.remove_observer(self._on_status)
        if self.notices is not None:
            self.notices.close()
        if self._ticker is not None:
            self._ticker.cancel()
        self.cluster = self._ticker = self.notices = None

    def note(self, text: str) -> None:
        """Show one more line under the status (a notice)."""
        self.noted.append(text)
        self.notes.value += f"<div>{html.escape(text)}</div>"

    def close(self) -> None:
        self.unbind()
        super().close()

    def _on_status(self, status: Status) -> None:
        self.render(status)

    def render(self, status: Status) -> None:
        cluster = self.cluster
        since = _since(cluster) if cluster is not None else None
        self.badge.value = badge_html(status.state)
        if cluster is not None:
            line = spec_status_line(status, cluster.spec, since=since)
        else:
            line = status_line(status)
        self.line.value = f"<span>{html.escape(line)}</span>"
        self.progress.max = max(1, status.nodes_wanted)
        self.progress.value = min(status.nodes_joined, self.progress.max)
        self.progress.bar_style = "success" if status.state.is_up else ""
        self.link.value = _links_html(cluster) if cluster is not None else ""
        if status.state.value != self.state:
            self.history.append(status.state.value)
            self.state = status.state.value

    async def _tick(self, cluster: SlurmRayCluster) -> None:
        while self.cluster is cluster and not cluster.state.is_final:
            await asyncio.sleep(10 if cluster.state.is_up else 1)
            if self.cluster is cluster:
                self.render(cluster.status)
                if self.notices is not None:
                    self.notices.check(cluster.status)

    def __repr__(self) -> str:
        if self.cluster is None:
            return "StatusView(no cluster)"
        return (
            f"{self.cluster.spec.name}: {spec_status_line(self.cluster.status, self.cluster.spec)}"
        )


def _links_html(cluster: SlurmRayCluster) -> str:
    links = dashboard_links(cluster.id, cluster.dashboard_url)
    url = links.get("proxied") or links.get("direct")
    if not url or not cluster.state.is_up:
        return ""
    escaped = html.escape(url, quote=True)
    return f'Ray dashboard: <a href="{escaped}" target="_blank" rel="noopener">{escaped}</a>'


class TextProgress:
    """Prints one line per state change of a cluster (terminal IPython, scripts)."""

    def __init__(self, cluster: SlurmRayCluster, stream: TextIO | None = None) -> None:
        self.cluster = cluster
        self.stream = stream
        self.started = time.monotonic()
        self._last = ""
        cluster.add_observer(self._on_status)
        self._on_status(cluster.status)

    def _on_status(self, status: Status) -> None:
        line = spec_status_line(status, self.cluster.spec)
        if line != self._last:
            self._last = line
            stream = self.stream or sys.stdout
            print(f"[{time.monotonic() - self.started:6.1f}s] {line}", file=stream, flush=True)

    def close(self) -> None:
        self.cluster.remove_observer(self._on_status)
