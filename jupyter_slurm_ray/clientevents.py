"""What a client process (a kernel, the CLI, the server) appends to a cluster's ``events.jsonl``
beside the bootstrap's events: ``stop_requested``, the owner's decisions (``scaled``,
``adapt``, ``rotated``…), and the requests another process makes of the owner
(``scale_request``, ``adapt_request``), which the owner reads every tick anyway and applies in
the order they were made (no new file, no new poll).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from .bootstrap.jsr_wire import EVENTS_FILE, Event, Role
from .transport import Transport

# Constant program (``sh -c APPEND sh LINE FILE``): one line appended to the events file.
_APPEND = 'printf "%s\\n" "$1" >> "$2"'


async def append_event(
    transport: Transport, job_dir: str, event: str, *, within: float = 60.0, **fields: Any
) -> None:
    """One event of this process (role client) appended to the cluster's ``events.jsonl``
    (TransportError when not done ``within`` seconds)."""
    record = {"t": time.time(), "event": event, "role": Role.CLIENT}
    record.update(host=socket.gethostname(), pid=os.getpid(), **fields)
    line = json.dumps(record)
    argv = ["sh", "-c", _APPEND, "sh", line, f"{job_dir}/{EVENTS_FILE}"]
    await transport.run(argv, timeout=within)


async def request_scale(
    transport: Transport, job_dir: str, nodes: int, group: str | None = None
) -> None:
    """Ask the cluster's owner to scale to ``nodes`` (of ``group``): a ``scale_request``."""
    fields: dict[str, Any] = {"nodes": nodes} if group is None else {"nodes": nodes, "group": group}
    await append_event(transport, job_dir, Event.SCALE_REQUEST, **fields)


def request_cause(event: Mapping[str, Any]) -> str:
    return f"asked by pid {event.get('pid')} on {event.get('host')}"


def made_after(event: Mapping[str, Any], kind: str, since: float) -> bool:
    """``event`` is a request of ``kind`` made at or after ``since``."""
    t = event.get("t")
    return event.get("event") == kind and isinstance(t, int | float) and t >= since


def requested_nodes(event: Mapping[str, Any], since: float) -> tuple[int, str | None] | None:
    """(node count, group or None) of a scale request made after ``since`` (this owner's
    start), else None."""
    nodes, group = event.get("nodes"), event.get("group")
    if not made_after(event, Event.SCALE_REQUEST, since):
        return None
    if not isinstance(nodes, int) or isinstance(nodes, bool):
        return None
    return nodes, group if isinstance(group, str) else None
