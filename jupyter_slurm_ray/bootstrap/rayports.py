"""What this node's Ray bound and who it is, as Ray 2.60 tells it in the node's session dir.

Given port 0, Ray's processes bind where the kernel lets them and say where: the GCS and the
agents in port files named after the node's Ray node id (``gcs_server_port_<node id>``, …),
the raylet in its log ("NodeManager server started, listening on port N"), the dashboard in
its log ("Dashboard head http address: IP:PORT"). The session dir is in the node's private
temp dir: nobody else writes there. What is read here is only a claim: the listener on a
port is verified as this node's Ray's (``listeners.OwnListeners``) before anything is sent.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

NODE_ID = re.compile(r"_port_([0-9a-f]{56})$")
RAYLET_SAYS = re.compile(r"(NodeManager|ObjectManager) server started, listening on port (\d+)")
DASHBOARD_SAYS = re.compile(r"Dashboard head http address: \[?[0-9a-fA-F.:]+\]?:(\d+)")
RAYLET_NAMES = {"NodeManager": "node_manager", "ObjectManager": "object_manager"}
READ_LIMIT = 1024 * 1024


def session_dir(temp_dir: Path) -> Path:
    return temp_dir / "session_latest"


def node_id(temp_dir: Path) -> str | None:
    """This node's Ray node id, from the names of the port files its processes wrote."""
    with contextlib.suppress(OSError):
        for path in session_dir(temp_dir).iterdir():
            match = NODE_ID.search(path.name)
            if match:
                return match.group(1)
    return None


def gcs_port(temp_dir: Path) -> int | None:
    """The head's GCS port (``--port=0``): the port file ``gcs_server_port_<node id>``."""
    for path in session_dir(temp_dir).glob("gcs_server_port_*"):
        port = read_port(path)
        if port is not None:
            return port
    return None


def read_port(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        port = int(path.read_text().strip())
        if 0 < port < 65536:
            return port
    return None


def log_head(path: Path) -> str:
    """The first READ_LIMIT bytes of a log (what it says at start)."""
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        return handle.read(READ_LIMIT).decode(errors="replace")
    return ""


def raylet_ports(temp_dir: Path) -> dict[str, int]:
    """``node_manager`` and ``object_manager`` as the raylet said it bound them."""
    said = log_head(session_dir(temp_dir) / "logs" / "raylet.out")
    return {RAYLET_NAMES[name]: int(port) for name, port in RAYLET_SAYS.findall(said)}


def dashboard_port(temp_dir: Path) -> int | None:
    """The dashboard's HTTP port (``--dashboard-port=0``) as its log says it bound it."""
    match = DASHBOARD_SAYS.search(log_head(session_dir(temp_dir) / "logs" / "dashboard.log"))
    return int(match.group(1)) if match else None
