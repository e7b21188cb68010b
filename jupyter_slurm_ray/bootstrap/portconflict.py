"""Recognises a `ray start` whose port was taken meanwhile, from what Ray 2.60 logs.

Measured with one port of the block held by another process (node address, no SO_REUSEPORT):
node_manager / object_manager: the raylet logs "Failed to start the grpc server. The
specified port is N" within a second, but `ray start` itself exits only ~40 s later; client
and dashboard: "Failed to bind to H:N" and `ray start` exits in 3-5 s; autoscaler_metrics and
dashboard_metrics: "[Errno 98] Address already in use" in that component's log while `ray
start` keeps running without it. So the session's logs are read while the node starts, not
only `ray start`'s exit. (A port bound without listening shows in no /proc/net/tcp table:
only the logs tell; a listener of another user is seen by ``listeners.py`` first.) The GCS and
the agents take kernel-assigned ports: a line of theirs that names no port of the block is
not about the block.
"""

from __future__ import annotations

import re
from pathlib import Path

from jsr_base import PortConflict
from portblock import PortBlock, port_name

CONFLICT = re.compile(
    r"address already in use|failed to bind|already occupied|errno 98\b"
    r"|failed to start the grpc server|port \d+ (?:is )?(?:already in use|not available)",
    re.IGNORECASE,
)
READABLE = re.compile(r"port is \d+|failed to bind to|already occupied|errno 98\]", re.IGNORECASE)
PORT_MENTIONS = re.compile(r"port is (\d+)|port (\d+)|:(\d+)\b|', (\d+)\)")
# the component log that names no port: which port of the block it failed on (Ray 2.60)
COMPONENT_PORT = {
    "monitor": "autoscaler_metrics",
    "dashboard": "dashboard_metrics",
}
READ_LIMIT = 256 * 1024
SAID = 110  # characters of the log line quoted in the reason


class ConflictScan:
    """Reads what `ray start`'s log and the session's component logs gained since a start."""

    def __init__(self, block: PortBlock, ray_log: Path, session_logs: Path) -> None:
        self.block = block
        self.ray_log = ray_log
        self.session_logs = session_logs
        self.offsets = {ray_log: file_size(ray_log)}  # what earlier attempts wrote is old

    def files(self) -> list[Path]:
        found = [self.ray_log]
        for pattern in ("*.err", "*.log"):
            found += sorted(self.session_logs.glob(pattern))
        return found

    def check(self) -> PortConflict | None:
        """The first conflict in what the logs gained (a line naming the port preferred)."""
        for path in self.files():
            named = path == self.ray_log or path.name.rsplit(".", 1)[0] in COMPONENT_PORT
            lines = [
                line.strip()
                for line in self.new_lines(path)
                if CONFLICT.search(line) and (named or self.ports_in(line))
            ]
            if lines:
                lines.sort(key=lambda line: (not READABLE.search(line), not self.ports_in(line)))
                return self.conflict(path, lines[0])
        return None

    def new_lines(self, path: Path) -> list[str]:
        offset = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read(READ_LIMIT)
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offsets[path] = offset + len(complete)
        return complete.decode(errors="replace").splitlines()

    def ports_in(self, line: str) -> list[int]:
        """Ports of the block the line names."""
        start, end = self.block.start, self.block.start + self.block.size
        mentioned = {int(n) for m in PORT_MENTIONS.finditer(line) for n in m.groups() if n}
        return sorted(port for port in mentioned if start <= port < end)

    def conflict(self, path: Path, line: str) -> PortConflict:
        ports = self.ports_in(line)
        component = path.name.rsplit(".", 1)[0]
        if not ports and component in COMPONENT_PORT:
            ports = [self.block.ports[COMPONENT_PORT[component]]]
        names = [port_name(port - self.block.start) for port in ports]
        match = CONFLICT.search(line)
        phrase = line[match.start() if match else 0 :][:SAID].split(" {")[0]  # not gRPC's dump
        if phrase.rfind(". ") > 40:  # whole sentences where they fit
            phrase = phrase[: phrase.rfind(". ") + 1]
        return PortConflict(ports, names, f"{path.name}: {phrase}", [f"{path.name}: {line}"])


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
