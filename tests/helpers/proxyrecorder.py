"""A stand-in HTTP proxy that forwards nothing and records every connection made to it: what a
client honouring ``http_proxy``/``https_proxy``/``all_proxy``/``grpc_proxy`` would hand a proxy
(a request line with the full URL and its headers, answered with a 502; or a ``CONNECT``,
accepted, and what the client sends into the tunnel).

Standard library only. In a thread of the test (``ProxyRecorder``), or as its own program —
``/usr/bin/python3 -c "<this file's text>" PORT [HOST]``, one JSON line per connection on stdout
— e.g. run by another user inside a compute node's namespace (:func:`recorder_argv`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

REFUSAL = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
HTTP2_SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PROXY_NAMES = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy")


def proxy_environment(url: str) -> dict[str, str]:
    """Every proxy variable, lower and upper case (``grpc_proxy`` too), set to ``url``, and the
    exceptions (``no_proxy``, ``no_grpc_proxy``) empty: loopback is not exempt either."""
    names = [*PROXY_NAMES, *(name.upper() for name in PROXY_NAMES)]
    return {
        **dict.fromkeys(names, url),
        **dict.fromkeys(("no_proxy", "NO_PROXY", "no_grpc_proxy"), ""),
    }


def record(conn: socket.socket, peer: tuple, keep: Callable[[dict[str, str]], None]) -> None:
    """What one connection sent, to ``keep``: its request up to the end of the headers (or 1 s
    of silence), kept before it is refused; a ``CONNECT`` is accepted instead, and what the
    client then sends into the tunnel (a TLS hello, or HTTP/2 with gRPC's metadata) is kept
    too, after 1 s of silence."""
    conn.settimeout(1.0)
    data = b""
    seen = {"peer": f"{peer[0]}:{peer[1]}", "request": "", "tunnelled": ""}
    try:
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        seen["request"] = data.decode("latin-1")
        if data.startswith(b"CONNECT "):
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            seen["tunnelled"] = _until_quiet(conn).decode("latin-1")
        else:
            keep(seen)  # before the answer: a client that got it finds its request kept
            seen = {}
            conn.sendall(REFUSAL)
    except OSError:
        pass
    finally:
        conn.close()
        if seen:
            keep(seen)


def _until_quiet(conn: socket.socket) -> bytes:
    """What the client sends into an accepted tunnel; to an HTTP/2 client (gRPC) the tunnel
    answers as a server would at first (its settings, and an ack of the client's), so that
    the client goes on to send its request's headers."""
    data = b""
    try:
        while len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            if not data and chunk.startswith(HTTP2_PREFACE):
                conn.sendall(HTTP2_SETTINGS + HTTP2_SETTINGS_ACK)
            data += chunk
    except OSError:  # 1 s of silence
        pass
    return data


def serve(listener: socket.socket, found: list[dict[str, str]] | None = None) -> None:
    """Accept until the listener is closed; each record appended to ``found``, or printed."""
    keep = found.append if found is not None else _print
    while True:
        try:
            conn, peer = listener.accept()
        except OSError:
            return
        record(conn, peer, keep)


def _print(seen: dict[str, str]) -> None:
    print(json.dumps(seen), flush=True)


class ProxyRecorder:
    """The recorder on a free port of ``host``, served by a thread of this process."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.seen: list[dict[str, str]] = []
        self._thread = threading.Thread(target=serve, args=(self.listener, self.seen), daemon=True)
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the thread
        self.listener.close()
        self._thread.join(5)


def recorder_argv(port: int, host: str = "0.0.0.0") -> list[str]:
    """argv of the recorder as its own program (prints ``listening`` once it listens)."""
    return ["/usr/bin/python3", "-c", Path(__file__).read_text(), str(port), host]


def main(argv: list[str]) -> None:
    listener = socket.create_server((argv[1] if len(argv) > 1 else "0.0.0.0", int(argv[0])))
    print("listening", flush=True)
    serve(listener)


if __name__ == "__main__":
    main(sys.argv[1:])
