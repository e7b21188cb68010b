"""The head's Ray dashboard state API: which nodes are alive, and whether a port answers."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from dashhttp import DashboardHTTPError, dashboard_url, get_json
from jsr_wire import NODE_RESOURCE

HTTP_TIMEOUT = 1.0  # short: a stop signal must be handled well within Slurm's KillWait


def node_rows(payload: Any) -> list[dict[str, Any]]:
    """The node list in a /api/v0/nodes reply: {"data": {"result": {"result": [...]}}}."""
    found = payload
    for key in ("data", "result", "result"):
        if isinstance(found, dict):
            found = found.get(key)
    return [row for row in found if isinstance(row, dict)] if isinstance(found, list) else []


def alive_slurm_nodes(rows: list[dict[str, Any]]) -> list[str]:
    """IPs of ALIVE nodes that carry the slurm_ray_node resource, sorted."""
    return sorted(
        str(row.get("node_ip"))
        for row in rows
        if row.get("state") == "ALIVE" and NODE_RESOURCE in (row.get("resources_total") or {})
    )


class Dashboard:
    """The head's state API, asked with the cluster token, straight to the head (dashhttp)."""

    def __init__(self, ip: str, port: int, token: str) -> None:
        self.url = dashboard_url(ip, port, "api/v0/nodes?limit=1000")
        self.token = token

    def rows(self) -> list[dict[str, Any]] | None:
        """The state API's node rows, or None while the dashboard does not answer."""
        try:
            payload = get_json(
                self.url, self.token, connect_timeout=HTTP_TIMEOUT, read_timeout=HTTP_TIMEOUT
            )
        except DashboardHTTPError:
            return None
        return node_rows(payload)

    def alive_nodes(self) -> list[str] | None:
        """Alive node IPs, or None while the dashboard does not answer."""
        rows = self.rows()
        return None if rows is None else alive_slurm_nodes(rows)

    def alive_node_id(self, ip: str) -> str | None:
        """The Ray node id of the alive node at ``ip`` (None: not known, or not one node)."""
        ids = [
            str(row.get("node_id"))
            for row in self.rows() or []
            if row.get("state") == "ALIVE" and row.get("node_ip") == ip and row.get("node_id")
        ]
        return ids[0] if len(ids) == 1 else None

    def node_gone(self, node_id: str) -> bool:
        """The node is no longer ALIVE (a drained raylet exits; `ray start --block` may not)."""
        rows = self.rows()
        if rows is None:
            return False
        return not any(r.get("node_id") == node_id and r.get("state") == "ALIVE" for r in rows)


def port_open(ip: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=HTTP_TIMEOUT):
        return True
    return False
