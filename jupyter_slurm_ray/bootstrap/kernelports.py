"""port_strategy 'kernel': every port of a node is chosen by the kernel when it is bound, so
nobody can predict one, take it first, or drain a range.

Ray binds port 0 and announces the port for its GCS, raylet (node manager, object manager),
workers (``--min-worker-port=0 --max-worker-port=0``), agents and dashboard (``rayports.py``
reads what it bound). Ray Client's proxier is the one server that needs a number on its
command line (readable by every user of the node seconds before it binds): the bootstrap
takes a port from the kernel and holds it, on the node's address and on loopback where the
proxier listens, with sockets bound with SO_REUSEPORT and not listening. Linux lets only a
socket of the same uid with SO_REUSEPORT share such a port: the proxier's gRPC server does
(gRPC sets it), another user's bind fails. Once the proxier listens the holders close
(``publish``).

The same shape as ``portblock.PortBlock``, so a node plans its `ray start` with either.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass, field

from jsr_wire import PORT_NAMES

LOOPBACK = "127.0.0.1"
HOLD_ATTEMPTS = 20  # kernel-chosen ports whose loopback twin another socket holds: try again


def held_port(ip: str) -> tuple[int, list[socket.socket]]:
    """A port the kernel chose on ``ip``, held there and on loopback (SO_REUSEPORT, no
    SO_REUSEADDR, not listening): only a listener of this user with SO_REUSEPORT binds it."""
    for _ in range(HOLD_ATTEMPTS):
        first = holder((ip, 0))
        port = first.getsockname()[1]
        if ip == LOOPBACK:
            return port, [first]
        try:
            return port, [first, holder((LOOPBACK, port))]
        except OSError:
            first.close()
    raise OSError(f"no port of {ip} was free on loopback too after {HOLD_ATTEMPTS} tries")


def holder(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class KernelPorts:
    """A node's ports under port_strategy 'kernel': 0 (the kernel's choice at bind time) for
    all but Ray Client's, which is held until the proxier listens (the head only)."""

    client: int = 0
    holders: list[socket.socket] = field(default_factory=list)
    start: int = 0  # no block
    size: int = 0

    @classmethod
    def for_node(cls, ip: str, head: bool) -> KernelPorts:
        if not head:
            return cls()
        port, holders = held_port(ip)
        return cls(port, holders)

    @property
    def ports(self) -> dict[str, int]:
        named = dict.fromkeys(PORT_NAMES, 0)
        named["client"] = self.client
        return {**named, "min_worker": 0, "max_worker": 0}

    @property
    def ports_range(self) -> range:
        return range(0)

    def publish(self) -> None:
        """Ray bound its ports: the client port's holders are no longer needed."""
        self.release()

    def release(self) -> None:
        holders, self.holders = self.holders, []
        for sock in holders:
            with contextlib.suppress(OSError):
                sock.close()
