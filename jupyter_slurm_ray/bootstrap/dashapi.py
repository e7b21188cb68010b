"""The head's Ray dashboard state API: which nodes are alive, and whether a port answers."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request
from typing import Any

from jsr_base import NODE_RESOURCE

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
    """The head's state API, asked with the cluster token and without any proxy."""

    def __init__(self, ip: str, port: int, token: str) -> None:
        self.url = f"http://{ip}:{port}/api/v0/nodes?limit=1000"
        self.headers = {"X-Ray-Authorization": f"Bearer {token}"}
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def rows(self) -> list[dict[str, Any]] | None:
        """The state API's node rows, or None while the dashboard does not answer."""
        request = urllib.request.Request(self.url, headers=self.headers)
        try:
            with self.opener.open(request, timeout=HTTP_TIMEOUT) as reply:
                return node_rows(json.loads(reply.read()))
        except (OSError, ValueError):
            return None

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
