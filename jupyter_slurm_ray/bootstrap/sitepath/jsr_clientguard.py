"""Ray Client's proxier gives a client's requests, with the cluster token, only to the server
it started for that client, on a port nobody else can take.

The proxier (on the head) starts one server per client on 127.0.0.1:<port>. Ray takes the
port from 23000-23999, one range for every user and cluster of the node, in order, by binding
and closing it; the new server binds it again a second or two later, once Python imported
Ray. Another user holding that range blocked Ray Client to every cluster on the node; two
clusters of one user connecting at once walked the range in lockstep and collided; and in
between the probe and the server's bind, another user could bind the port (he sees it on the
server's command line) and, without TLS, receive the token (measured on the testbed with Ray
2.60: in the headers of ``RayletDataStreamer/Datapath``). So here:

- the port is the kernel's choice (``hold_port``), held until the server listens by a socket
  bound with SO_REUSEPORT and not listening: the server's gRPC listener (SO_REUSEPORT, same
  user) binds beside it, another user's bind fails;
- every path of the proxier to a client's server goes through ``ProxyManager.get_channel``
  (the first request, a reconnect, the log stream, each unary call): it hands out the channel
  only while every listener on the server's port is a socket of the server's own processes
  (checked once, then only that the same sockets still listen there); the start itself fails
  when they are not ("Starting Ray client server failed", which clients retry).

Installed by ``sitecustomize`` in every Python process of the cluster's Ray; it acts only in
the proxier, once ``ray.util.client.server.proxier`` is imported. The /proc reading mirrors
the bootstrap's ``listeners.py`` (this file runs in Ray's processes, where that is not
importable).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import socket
import sys
import threading
import time
from types import ModuleType
from typing import Any

TARGET = "ray.util.client.server.proxier"
LISTEN_WAIT = 30.0  # s for a client's server to listen (Ray's own channel timeout)
LOOPBACK = "127.0.0.1"  # where Ray's proxier starts its per-client servers

_held: dict[int, socket.socket] = {}  # port -> the socket holding it until its server listens
_held_lock = threading.Lock()


def hold_port(family: int = socket.AF_INET) -> int:
    """A loopback port the kernel chose, held (SO_REUSEPORT, not listening) until ``let_go``."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("::1" if family == socket.AF_INET6 else LOOPBACK, 0))
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    with _held_lock:
        _held[port] = sock
    return port


def let_go(port: int) -> None:
    with _held_lock:
        sock = _held.pop(port, None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


def listening_sockets(port: int) -> dict[int, int]:
    """inode -> uid of every listening TCP socket on ``port`` in this network namespace."""
    found = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            words = row.split()
            if len(words) > 9 and words[3] == "0A" and int(words[1].rsplit(":", 1)[1], 16) == port:
                found[int(words[9])] = int(words[7])
    return found


def process_tree(root: int) -> set[int]:
    """root and its descendants (this user's processes, by their parent pid)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - tree
        tree |= frontier
    return tree


def socket_inodes(pids: set[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def foreign_listener(port: int, process: Any, wait: float = LISTEN_WAIT) -> str | None:
    """Why the client's server on ``port`` must not be sent anything, or None once every
    listener there is a socket of its processes."""
    deadline = time.monotonic() + wait
    while True:
        found = listening_sockets(port)
        if found:
            ours = socket_inodes(process_tree(process.pid))
            strangers = sorted({uid for inode, uid in found.items() if inode not in ours})
            if not strangers:
                return None
            return f"port {port} has a listener of uid {strangers} that is not its server's"
        if process.poll() is not None:
            return f"its server exited (status {process.poll()}) before it listened on {port}"
        if time.monotonic() > deadline:
            return f"its server did not listen on {port} within {wait:g} s"
        time.sleep(0.05)


def refusal(server: Any) -> str | None:
    """Why not to send to this client's server now, or None: the sockets verified as its own
    still listen on its port (verified now when that is not known yet)."""
    verified: frozenset[int] | None = getattr(server, "jsr_verified", None)
    found = set(listening_sockets(server.port))
    if verified and found and found <= verified:
        return None
    handle = server.process_handle_future.result()
    if handle is None:
        return "its server did not start"
    reason = foreign_listener(server.port, handle.process)
    if reason is None:
        server.jsr_verified = frozenset(listening_sockets(server.port))
    let_go(server.port)  # it listens (or never will): the holder is no longer needed
    return reason


def guard(proxier: ModuleType) -> None:
    """ProxyManager: a client's server whose port is not its own is never connected to."""
    manager = proxier.ProxyManager
    start, get = manager.start_specific_server, manager.get_channel

    def _get_unused_port(self: Any, family: int = socket.AF_INET) -> int:
        return hold_port(family)

    def start_specific_server(self: Any, client_id: str, job_config: Any) -> bool:
        if not start(self, client_id, job_config):
            server = self._get_server_for_client(client_id)
            if server is not None:
                let_go(server.port)
            return False
        server = self._get_server_for_client(client_id)
        reason = refusal(server) if server is not None else "it is not known"
        if reason is None:
            return True
        proxier.logger.error(f"Not sending client {client_id}'s requests there: {reason}")
        if server is not None:
            server.kill()
        return False

    def get_channel(self: Any, client_id: str) -> Any:
        server = self._get_server_for_client(client_id)
        if server is None:
            return get(self, client_id)
        try:
            server.wait_ready()  # as Ray's own get_channel does first
        except RuntimeError:
            return get(self, client_id)  # its start failed: Ray's answer, unchanged
        reason = refusal(server)
        if reason is not None:
            proxier.logger.error(f"Not sending client {client_id}'s requests there: {reason}")
            return None
        return get(self, client_id)

    manager._get_unused_port = _get_unused_port
    manager.start_specific_server = start_specific_server
    manager.get_channel = get_channel
    manager.jsr_guarded = True


class GuardAfterImport(importlib.abc.MetaPathFinder):
    """Finds the proxier module as usual and guards it once it has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            guard(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if not any(isinstance(finder, GuardAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, GuardAfterImport())
