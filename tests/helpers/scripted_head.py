"""A scripted "head" for the proxy's fast tests: a raw asyncio HTTP/1.1 server on loopback that
answers each request with what the test scripted for its path, byte for byte, so it can do
what no real server does on purpose (answer twice, send 1xx, huge headers, stall, cut a body).

It records every request (which connection it came on, its head and body) and the connections
the client closed, so tests can tell a reused connection from a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answer(status: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> bytes:
    """An answer with ``Content-Length`` (unless ``headers`` frame the body themselves)."""
    lines = [f"HTTP/1.1 {status}"]
    named = {name.lower() for name, _ in headers or []}
    for name, value in headers or []:
        lines.append(f"{name}: {value}")
    if "content-length" not in named and "transfer-encoding" not in named:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sends(*parts: bytes) -> Script:
    """A script that writes ``parts`` at once, then serves the connection's next request."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(parts))
        await writer.drain()

    return script


@dataclass
class Request:
    connection: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedHead:
    scripts: dict[str, Script]
    requests: list[Request] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)  # connections ended by the client
    port: int = 0
    _server: asyncio.Server | None = None
    _connections: int = 0
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> ScriptedHead:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        number = self._connections
        self._writers.append(writer)
        try:
            while True:
                request = await _read_request(reader, number)
                if request is None:
                    self.closed.append(number)
                    return
                self.requests.append(request)
                script = self.scripts.get(request.path.split("?")[0], sends(answer("404 x")))
                await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed.append(number)
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader, number: int) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    line, *fields = head.decode("latin-1").split("\r\n")
    method, path, _ = line.split(" ", 2)
    headers = dict(f.split(": ", 1) for f in fields if f)
    length = int(headers.get("Content-Length", "0"))
    body = await reader.readexactly(length) if length else b""
    return Request(number, method, path, headers, body)


@contextlib.contextmanager
def unanswered_listener() -> Iterator[int]:
    """The port of a listening socket whose backlog is full: a new connection to it is never
    accepted (its SYN is dropped), so a client's connect hangs."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):  # the accept queue holds backlog + 1: more than enough to fill it
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port
