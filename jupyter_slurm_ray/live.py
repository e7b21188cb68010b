"""Live status of one cluster: a compact ipywidgets view in notebooks, printed lines elsewhere.

Both are driven by the cluster's observers (called on the background loop thread); nothing in the
browser polls. A ticker on the same loop refreshes the elapsed time and the walltime left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import html
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

import ipywidgets as widgets
from traitlets import Unicode

from .aio import background_loop
from .formatting import status_line
from .reprs import badge_html, dashboard_links
from .states import Status

if TYPE_CHECKING:
    from .cluster import SlurmRayCluster

log = logging.getLogger(__name__)

__all__ = ["StatusView", "TextProgress", "frontend_has_widgets"]


def frontend_has_widgets() -> bool:
    """True inside a Jupyter kernel (whose frontend can render widgets), not in a terminal."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _since(cluster: SlurmRayCluster) -> float:
    return cluster.history[0].at if cluster.history else cluster.status.at


class StatusView(widgets.VBox):
    """State badge, status line, nodes-joined bar and dashboard link of one cluster."""

    state = Unicode("", help="The state shown now (not synced; for observers and tests).")

    def __init__(self, cluster: SlurmRayCluster | None = None, **kwargs: Any) -> None:
        self.badge = widgets.HTML()
        self.line = widgets.HTML()
        self.progress = widgets.IntProgress(
            min=0, max=1, description="nodes", layout=widgets.Layout(width="260px")
        )
        self.link = widgets.HTML()
        top = widgets.HBox([self.badge, self.progress, self.line])
        super().__init__([top, self.link], **kwargs)
        self.cluster: SlurmRayCluster | None = None
        self._ticker: concurrent.futures.Future[None] | None = None
        self.history: list[str] = []  # every state shown, in order
        if cluster is not None:
            self.bind(cluster)

    def bind(self, cluster: SlurmRayCluster) -> None:
        """Show ``cluster`` from now on (the panel binds a new cluster after each Up)."""
        self.unbind()
        self.cluster = cluster
        cluster.add_observer(self._on_status)
        self.render(cluster.status)
        self._ticker = asyncio.run_coroutine_threadsafe(self._tick(cluster), background_loop())

    def unbind(self) -> None:
        if self.cluster is not None:
            self.cluster.remove_observer(self._on_status)
        if self._ticker is not None:
            self._ticker.cancel()
        self.cluster = self._ticker = None

    def close(self) -> None:
        self.unbind()
        super().close()

    def _on_status(self, status: Status) -> None:
        self.render(status)

    def render(self, status: Status) -> None:
        cluster = self.cluster
        since = _since(cluster) if cluster is not None else None
        self.badge.value = badge_html(status.state)
        self.line.value = f"<span>{html.escape(status_line(status, since=since))}</span>"
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

    def __repr__(self) -> str:
        if self.cluster is None:
            return "StatusView(no cluster)"
        return f"{self.cluster.spec.name}: {status_line(self.cluster.status)}"


def _links_html(cluster: SlurmRayCluster) -> str:
    links = dashboard_links(cluster)
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
        line = status_line(status)
        if line != self._last:
            self._last = line
            stream = self.stream or sys.stdout
            print(f"[{time.monotonic() - self.started:6.1f}s] {line}", file=stream, flush=True)

    def close(self) -> None:
        self.cluster.remove_observer(self._on_status)
