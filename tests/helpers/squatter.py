"""A hostile neighbour, run as another user inside a compute node's network namespace.

``python3 squatter.py VICTIM_UID OUT_DIR SECONDS MODE [PORT ...]`` binds the PORTs at once;
MODE ``watch:LOW-HIGH``: it then watches the node's TCP sockets for every new listening socket
of VICTIM_UID on a port in LOW-HIGH (the port range of the cluster under test: the victim's
other clusters on the node are not his target) and binds the ten ports after it (where it
can), as soon as it appears;
``clientserver:K:GCS``: it watches the victim's new processes for Ray Client's per-client
server of the cluster whose GCS is at GCS (``--mode=specific-server --address=GCS --port=N``
on its command line, readable by every user: the other clusters on the host are not his
target) and binds its port N before that server does, for the first K of them;
``freed:FILE``: it watches the ports FILE lists (the victim cluster's listeners on this node,
kept current by the test) and binds each one as soon as nothing of the victim listens there
any more (with SO_REUSEADDR, over its closed connections), as on a node where one of the
victim's Ray processes died or a worker exited; ``hold``: nothing more. Each of its listeners
answers like an HTTP/2 server (its SETTINGS frame, then the ACK of the client's) so that a gRPC
client goes on to send its request headers, and records every byte it receives in
OUT_DIR/<port>-<n>.bin; OUT_DIR/log.jsonl says what it saw and did. Standard library only (the
node's own python3).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import struct
import sys
import threading
import time

SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty HTTP/2 SETTINGS frame
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
NEXT_PORTS = 10
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, TCP_LISTEN = 4, 20, 10  # linux/sock_diag.h, tcp_states.h
DUMP = 0x1 | 0x300  # NLM_F_REQUEST | NLM_F_DUMP
NLMSG_ERROR, NLMSG_DONE = 2, 3


class Squatter:
    def __init__(self, victim: int, out: str) -> None:
        self.victim = victim
        self.out = out
        self.held: dict[int, socket.socket] = {}
        self.seen: set[int] = set()
        self.accepted = 0
        self.lock = threading.Lock()
        self.diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)

    def note(self, **fields: object) -> None:
        fields["t"] = time.time()
        with self.lock, open(os.path.join(self.out, "log.jsonl"), "a") as log:
            log.write(json.dumps(fields) + "\n")

    def new_client_servers(
        self, gcs: str, first_seen: dict[str, float], done: set[str]
    ) -> list[int]:
        """Ports of the victim's Ray Client servers that started since the last look (a young
        process is read again: until its exec it shows its parent's command line)."""
        ports, now = [], time.monotonic()
        for name in os.listdir("/proc"):
            if not name.isdigit() or name in done:
                continue
            first = first_seen.setdefault(name, now)
            if now - first > 10:
                done.add(name)
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != self.victim:
                    done.add(name)
                    continue
                with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                    words = cmdline.read().split(b"\0")
            except OSError:
                done.add(name)
                continue
            if b"--mode=specific-server" in words and f"--address={gcs}".encode() in words:
                done.add(name)
                ports += [int(w[7:]) for w in words if w.startswith(b"--port=")]
        return ports

    def victims_listeners(self) -> set[int]:
        """The victim's listening ports in this network namespace, asked of the kernel with
        sock_diag (what ``ss -tl`` does): /proc/net/tcp walks every socket of the host's hash
        tables, 5-9 ms of CPU per read here, which made bob's 1 ms loop a whole core."""
        ports = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
            header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, DUMP, 1, 0)
            self.diag.send(header + request)
            for port, uid in self.diag_replies():
                if uid == self.victim:
                    ports.add(port)
        return ports

    def diag_replies(self) -> list[tuple[int, int]]:
        """(port, uid) of each inet_diag_msg of one dump, up to its NLMSG_DONE."""
        found = []
        while True:
            data, offset = self.diag.recv(1 << 16), 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    return found
                port = struct.unpack_from("!H", data, offset + 20)[0]  # idiag_sport
                uid = struct.unpack_from("=I", data, offset + 80)[0]  # idiag_uid
                found.append((port, uid))
                offset += (length + 3) & ~3

    def hold(self, port: int, after: int | None, reuse: bool = False) -> None:
        if port in self.held or not 1024 <= port <= 65535:
            return
        sock = socket.socket()
        try:
            if reuse:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            self.note(what="bind_failed", port=port, error=exc.strerror)
            return
        self.held[port] = sock
        self.note(what="squatting", port=port, after=after)
        threading.Thread(target=self.serve, args=(sock, port), daemon=True).start()

    def serve(self, sock: socket.socket, port: int) -> None:
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                number = self.accepted
            args = (conn, peer, port, number)
            threading.Thread(target=self.record, args=args, daemon=True).start()

    def record(self, conn: socket.socket, peer: tuple, port: int, number: int) -> None:
        self.note(what="accepted", port=port, peer=f"{peer[0]}:{peer[1]}", n=number)
        received = b""
        acked = False
        conn.settimeout(120)
        try:
            conn.sendall(SETTINGS)
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                received += data
                with open(os.path.join(self.out, f"{port}-{number}.bin"), "ab") as out:
                    out.write(data)
                if not acked and received.startswith(PREFACE) and len(received) >= 33:
                    conn.sendall(SETTINGS_ACK)
                    acked = True
        except OSError:
            pass
        finally:
            conn.close()
            self.note(what="closed", port=port, n=number, bytes=len(received))

    def run(self, seconds: float, mode: str, ports: list[int]) -> None:
        for port in ports:
            self.hold(port, None)
        self.note(what=mode)
        print("watching", flush=True)
        deadline = time.monotonic() + seconds
        if mode.startswith("clientserver:"):
            _, count, gcs = mode.split(":", 2)
            self.on_client_servers(int(count), gcs, deadline)
        if mode.startswith("freed:"):
            self.on_freed_ports(mode.removeprefix("freed:"), deadline)
        if not mode.startswith("watch:"):
            while time.monotonic() < deadline:
                time.sleep(0.5)
            return
        low, high = map(int, mode.removeprefix("watch:").split("-"))
        while time.monotonic() < deadline:
            listeners = {port for port in self.victims_listeners() if low <= port <= high}
            for port in sorted(listeners - self.seen):
                self.seen.add(port)
                self.note(what="victim_listener", port=port)
                for following in range(port + 1, port + 1 + NEXT_PORTS):
                    self.hold(following, port)
            time.sleep(0.001)

    def on_client_servers(self, count: int, gcs: str, deadline: float) -> None:
        done = {name for name in os.listdir("/proc") if name.isdigit()}  # before: not news
        first_seen: dict[str, float] = {}
        while count > 0 and time.monotonic() < deadline:
            for port in self.new_client_servers(gcs, first_seen, done)[:count]:
                self.note(what="client_server_seen", port=port)
                self.hold(port, port)
                count -= 1
            time.sleep(0.002)

    def on_freed_ports(self, listed: str, deadline: float) -> None:
        """Each port of the file that the victim listened on and no longer does: taken."""
        watched: set[int] = set()
        next_read = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_read:
                next_read = time.monotonic() + 0.05
                try:
                    with open(listed) as ports:
                        watched |= {int(word) for word in ports.read().split()}
                except (OSError, ValueError):
                    pass
            listening = self.victims_listeners()
            for port in sorted(watched - listening - set(self.held)):
                if port in self.seen:  # it listened before: freed now
                    self.note(what="freed", port=port)
                    self.hold(port, port, reuse=True)
                    self.seen.discard(port)  # once; again only if the victim listens again
            self.seen |= watched & listening
            time.sleep(0.001)


if __name__ == "__main__":
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a port range is a thousand sockets
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    victim, out, seconds, mode = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
    Squatter(victim, out).run(seconds, mode, [int(port) for port in sys.argv[5:]])
