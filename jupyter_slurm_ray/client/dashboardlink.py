"""Ray's own view of a connected cluster links its dashboard where this kernel's Jupyter server
proxies it.

What ``ray.init()`` returns (the package's context, ``rayinit.py``) names the dashboard in its
``dashboard_url`` and in the table a notebook shows for it. Ray fills both with the head's own
address, which a browser cannot use here: it is on the cluster's network, and it answers 401
without the cluster's token. Where the kernel's Jupyter server runs the extension (it sets
``naming.DASHBOARD_BASE_ENV`` for its kernels), both name the proxied dashboard instead, behind
Jupyter's own login. Elsewhere they stay Ray's (``jupyter slurm-ray dashboard NAME`` serves it
on this host's loopback).
"""

from __future__ import annotations

import os
from typing import Any

from ..naming import DASHBOARD_BASE_ENV

__all__ = ["link_proxied_dashboard", "proxied_dashboard"]


def proxied_dashboard(cluster_id: str) -> str | None:
    """The path of cluster ``cluster_id``'s dashboard on this kernel's Jupyter server (None:
    no server with the extension started this kernel)."""
    base = os.environ.get(DASHBOARD_BASE_ENV)
    return f"{base.rstrip('/')}/{cluster_id}/" if base and cluster_id else None


def link_proxied_dashboard(context: Any, cluster_id: str) -> None:
    """Make ``context`` (Ray's RayContext or ClientContext) name the proxied dashboard."""
    link = proxied_dashboard(cluster_id)
    if link is None or not hasattr(context, "_context_table_template"):
        return
    context.dashboard_url = link
    # Ray's table writes "http://" + dashboard_url: a path needs the table without that prefix
    context._context_table_template = lambda: _table(context, link)


def _table(context: Any, link: str) -> str:
    from ray.widgets import Template

    row = Template("context_dashrow.html.j2").render(dashboard_url=link)
    return str(
        Template("context_table.html.j2").render(
            python_version=context.python_version,
            ray_version=context.ray_version,
            dashboard_row=row,
        )
    )
