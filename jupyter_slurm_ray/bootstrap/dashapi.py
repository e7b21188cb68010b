"""The head's Ray dashboard state API: which nodes are alive (by Ray node id), and whether a
port answers. Asked by the head's bootstrap only (the workers read ``nodes.json``)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dashhttp import DashboardHTTPError, dashboard_url, get_json
from jsr_wire import NODE_RESOURCE

HTTP_TIMEOUT = 1.0  # short: a stop signal must be handled well within Slurm's KillWait


@dataclass(frozen=True, order=True)
class AliveNode:
    """A Ray node the head sees ALIVE: its address, and its id (two nodes may share a host)."""

    ip: str
    node_id: str

    def to_json(self) -> dict[str, str]:
        return {"ip": self.ip, "node_id": self.node_id}


def node_rows(payload: Any) -> list[dict[str, Any]]:
    """The node list in a /api/v0/nodes reply: {"data": {"result": {"result": [...]}}}."""
    found = payload
    for key in ("data", "result", "result"):
        if isinstance(found, dict):
            found = found.get(key)
    return [row for row in found if isinstance(row, dict)] if isinstance(found, list) else []


def alive_slurm_nodes(rows: list[dict[str, Any]]) -> list[AliveNode]:
    """The ALIVE nodes that carry the slurm_ray_node resource, sorted."""
    return sorted(
        AliveNode(str(row.get("node_ip")), str(row.get("node_id")))
        for row in rows
        if row.get("state") == "ALIVE"
        and row.get("node_id")
        and NODE_RESOURCE in (row.get("resources_total") or {})
    )


class Dashboard:
    """The head's state API, asked with the cluster token, straight to the head's dashboard,
    each request sent only once ``verify_peer`` said the listener that accepted the
    connection is the one verified as this job's Ray (dashhttp)."""

    def __init__(self, ip: str, port: int, token: str, verify_peer: Callable[[], bool]) -> None:
        self.url = dashboard_url(ip, port, "api/v0/nodes?limit=1000")
        self.token = token
        self.verify_peer = verify_peer

    def rows(self) -> list[dict[str, Any]] | None:
        """The state API's node rows, or None while the dashboard does not answer."""
        try:
            payload = get_json(
                self.url,
                self.token,
                connect_timeout=HTTP_TIMEOUT,
                read_timeout=HTTP_TIMEOUT,
                verify_peer=self.verify_peer,
            )
        except DashboardHTTPError:
            return None
        return node_rows(payload)

    def alive_nodes(self) -> list[AliveNode] | None:
        """The alive nodes, or None while the dashboard does not answer."""
        rows = self.rows()
        return None if rows is None else alive_slurm_nodes(rows)


def port_open(ip: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=HTTP_TIMEOUT):
        return True
    return False
