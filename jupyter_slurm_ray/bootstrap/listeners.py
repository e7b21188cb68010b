"""Whose listener answers on a port of this node: /proc/net/tcp{,6} and the sockets our Ray holds.

Another user of the node sees every listening socket (and its uid) in /proc/net/tcp and can
bind a port of our block before Ray does; whoever then sends the cluster token to "whatever
answers" on that port hands it over. So the bootstrap sends the token, and writes an address
into ``head.json`` or ``connection.json``, only for a port whose every listener that takes
connections to the node's address (on that address, or on every address) is a socket held by
a process of this node's own Ray session (its inode among their ``/proc/<pid>/fd`` links); a
listener of another uid on a port of the block means the block was lost to someone. A
listener of someone else on the same port of another address (loopback) receives nothing
sent to the node's address: it is no one's concern.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from jsr_base import PortConflict

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
PROC = Path("/proc")


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of this network namespace."""

    address: str
    port: int
    uid: int
    inode: int


def parse_address(text: str) -> tuple[str, int]:
    """``0100007F:1F90`` -> ("127.0.0.1", 8080); IPv6 alike (words in the host's byte order)."""
    hex_ip, hex_port = text.rsplit(":", 1)
    raw = bytes.fromhex(hex_ip)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(hex_port, 16)


def parse_table(text: str) -> list[Listener]:
    """The LISTEN rows of one /proc/net/tcp or tcp6 table."""
    found = []
    for line in text.splitlines()[1:]:
        words = line.split()
        if len(words) < 10 or words[3] != LISTEN:
            continue
        try:
            address, port = parse_address(words[1])
            found.append(Listener(address, port, int(words[7]), int(words[9])))
        except ValueError:
            continue
    return found


def listeners(proc: Path = PROC) -> list[Listener]:
    """Every listening TCP socket of this network namespace (IPv4 and IPv6)."""
    found: list[Listener] = []
    for name in ("tcp", "tcp6"):
        try:
            found += parse_table((proc / "net" / name).read_text())
        except OSError:
            continue
    return found


WILDCARDS = ("0.0.0.0", "::")


def answers_for(listener: Listener, ip: str | None) -> bool:
    """Whether ``listener`` takes connections to ``ip`` (None: any address counts)."""
    if ip is None:
        return True
    return listener.address in (ip, f"::ffff:{ip}", *WILDCARDS)


def still_listening(ip: str, port: int, inodes: frozenset[int], proc: Path = PROC) -> bool:
    """The sockets ``inodes`` listen on ``port`` and no other socket takes connections to
    ``ip`` there: asked once a connection to ip:port is open, it says that they accepted it
    (a socket that stopped listening never listens again)."""
    relevant = {
        found.inode for found in listeners(proc) if found.port == port and answers_for(found, ip)
    }
    return bool(relevant) and relevant <= inodes


def socket_inodes(pids: Iterable[int], proc: Path = PROC) -> set[int]:
    """The inodes of the sockets these processes hold (``socket:[N]`` links in their fd dirs)."""
    inodes = set()
    for pid in pids:
        try:
            entries = list(os.scandir(proc / str(pid) / "fd"))
        except OSError:
            continue
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes


def block_strangers(table: list[Listener], block: range) -> list[Listener]:
    """The listeners of another uid on a port of ``block``."""
    return [found for found in table if found.port in block and found.uid != os.getuid()]


def user_name(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def listener_conflict(port_names: dict[int, str], strangers: list[Listener]) -> PortConflict:
    """The block was lost: these ports have listeners that are not this job's Ray's."""
    ports = sorted({s.port for s in strangers})
    names = [port_names.get(port, "worker") for port in ports]
    uids = sorted({s.uid for s in strangers})
    if any(uid != os.getuid() for uid in uids):
        whose = "another user: " + ", ".join(user_name(u) for u in uids if u != os.getuid())
    else:
        whose = "another process of this user, not this job's Ray"
    what = f"listening there: {whose}"
    found = [f"{s.address}:{s.port} uid {s.uid} inode {s.inode}" for s in strangers]
    return PortConflict(ports, names, what, found, by_uids=uids)


@dataclass
class OwnListeners:
    """The listeners of this node's Ray session, verified before the token goes to them.

    ``session`` lists the pids of the session (procgroups.session_processes); ``block`` the
    block's ports, ``names`` their names. ``scan()`` reads the tables once per check.
    """

    session: Callable[[], set[int]]
    block: range
    names: dict[int, str]
    proc: Path = PROC
    ip: str | None = None  # the node's address: listeners elsewhere (loopback) do not count
    verified: dict[str, tuple[int, frozenset[int]]] = field(default_factory=dict)
    table: list[Listener] = field(default_factory=list)

    def scan(self) -> None:
        self.table = listeners(self.proc)

    def on_port(self, port: int) -> list[Listener]:
        """The listeners on ``port`` that take connections to the node's address."""
        return [found for found in self.table if found.port == port and answers_for(found, self.ip)]

    def check_block(self) -> None:
        """PortConflict if a port of the block has a listener of another uid: someone took it
        after the probe (and would receive whatever Ray's clients send there)."""
        strangers = block_strangers(self.table, self.block)
        if strangers:
            raise listener_conflict(self.names, strangers)

    def verify(self, name: str, port: int) -> bool:
        """True once every listener on the port is a socket of our Ray session (the first one
        remembered); False while nothing listens there; PortConflict when one is not ours."""
        if name in self.verified and self.still_ours(name):
            return True
        found = self.on_port(port)
        if not found:
            return False
        ours = socket_inodes(self.session(), self.proc)
        strangers = [listener for listener in found if listener.inode not in ours]
        if strangers:
            raise listener_conflict({port: name}, strangers)
        self.verified[name] = (port, frozenset(listener.inode for listener in found))
        return True

    def still_ours(self, name: str) -> bool:
        """The port's listeners are still the sockets verified (none gone, none added)."""
        if name not in self.verified:
            return False
        port, inodes = self.verified[name]
        found = {listener.inode for listener in self.on_port(port)}
        return bool(found) and found <= inodes

    def ports(self) -> dict[str, int]:
        """name -> port of every verified listener (what connection.json records)."""
        return {name: port for name, (port, _inodes) in sorted(self.verified.items())}

    def target(self, name: str) -> tuple[int, frozenset[int]] | None:
        """The port and sockets verified for ``name`` (None before): a thread may ask."""
        return self.verified.get(name)
