"""Kept-alive HTTP/1.1 connections from the Jupyter server to the dashboards, for the proxy.

jupyter-server-proxy opens a new connection (and resolves the host in a thread) for every
proxied request, which costs more than the request itself on a dashboard API call; a general
client (aiohttp's) costs about as much again in its own layers (tracing, cookies, URL objects,
timeouts, response objects). The proxy needs much less: one request at a time on a connection
to one of a few heads, a buffered answer. So this is a small pool of asyncio connections per
head whose replies are parsed by ``httptools`` (llhttp, the parser of Node.js and uvicorn):
content length, chunked and close-delimited bodies, keep-alive, errors. Written here because
no kept library offers a pooled client that thin; it halves the proxy's CPU per request.

``send`` is what the page route calls; ``fetch(request)`` is the ``tornado.httpclient`` face
jupyter-server-proxy's buffered path calls, so its response handling is used unchanged.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools
from tornado import httpclient, httputil

# Per-request headers of the hop to the head, not the end-to-end request's.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length", "expect"}
)
IDLE_SECONDS = 15.0  # a connection idle longer is closed (Ray's aiohttp closes after 75 s)
_RETRIED = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})  # idempotent methods


class HeadGone(ConnectionError):
    """The head closed or reset the connection, or did not answer in time."""

    def __init__(self, why: str, *, answered: bool) -> None:
        super().__init__(why)
        self.answered = answered  # some of the reply had arrived


@dataclass
class Reply:
    """A head's whole answer."""

    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    keep_alive: bool = False


class _Connection(asyncio.Protocol):
    """One connection to a head, one request at a time; the parser's callbacks fill a Reply."""

    def __init__(self, host: str, port: int) -> None:
        self.key = (host, port)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = time.monotonic()
        self._reply: Reply | None = None
        self._chunks: list[bytes] = []
        self._field: bytes = b""
        self._headers_done = False
        self._head_only = False
        self._done: asyncio.Future[Reply] | None = None

    # -- asyncio ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._reply is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"the head's answer is not valid HTTP: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._reply is None or self._done is None or self._done.done():
            return
        if self._headers_done and not self._reply.keep_alive:  # body delimited by the close
            self._finish()
        else:
            self._fail(f"the head closed the connection ({exc or 'EOF'})")

    # -- httptools callbacks ---------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        assert self._reply is not None
        self._reply.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._reply is not None
        self._reply.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        reply = self._reply
        assert reply is not None
        reply.status = self.parser.get_status_code()
        reply.keep_alive = self.parser.should_keep_alive()
        self._headers_done = True
        if self._head_only:  # a HEAD's answer has no body (llhttp cannot be told)
            reply.keep_alive = False
            self._finish()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self._finish()

    # -- the request -----------------------------------------------------------------------
    async def exchange(self, head: bytes, body: bytes | None, method: str) -> Reply:
        assert self.transport is not None and self._reply is None
        self._reply, self._chunks, self._headers_done = Reply(), [], False
        self._head_only = method == "HEAD"
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(head + body if body else head)
        try:
            return await self._done
        except BaseException:  # timed out, cancelled, failed: its state is unknown
            self.close()
            raise
        finally:
            self._reply = None
            self.idle_since = time.monotonic()

    def _finish(self) -> None:
        reply = self._reply
        if reply is None or self._done is None or self._done.done():
            return
        reply.body = b"".join(self._chunks)
        self._done.set_result(reply)
        if not reply.keep_alive:
            self.close()

    def _fail(self, why: str) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(HeadGone(why, answered=self._headers_done))
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class KeepAliveClient:
    """Pooled, kept-alive HTTP/1.1 connections to the heads."""

    def __init__(self, connections_per_host: int = 32) -> None:
        self.connections_per_host = connections_per_host
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def send(
        self,
        host: str,
        port: int,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None = None,
        timeout: float = 60.0,
    ) -> Reply:
        """The head's answer to one request (``target``: path and query); HeadGone when the
        head does not answer within ``timeout`` s, refuses or drops the connection."""
        head = request_head(method, target, host, port, headers, body)
        try:
            return await asyncio.wait_for(self._send(host, port, method, head, body), timeout)
        except asyncio.TimeoutError:
            raise HeadGone(f"no answer within {timeout:g} s", answered=False) from None

    async def _send(
        self, host: str, port: int, method: str, head: bytes, body: bytes | None
    ) -> Reply:
        reused = self._take_idle(host, port)
        if reused is not None:
            try:
                reply = await reused.exchange(head, body, method)
            except HeadGone as exc:  # it was closed by the head while idle: once more, afresh
                if exc.answered or method not in _RETRIED:
                    raise
            else:
                self._put_back(reused, reply)
                return reply
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(host, port), host, port)
        except OSError as exc:
            raise HeadGone(f"cannot connect to {host}:{port}: {exc}", answered=False) from None
        reply = await conn.exchange(head, body, method)
        self._put_back(conn, reply)
        return reply

    def _take_idle(self, host: str, port: int) -> _Connection | None:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_SECONDS:
                return conn
            conn.close()
        return None

    def _put_back(self, conn: _Connection, reply: Reply) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if reply.keep_alive and not conn.closed and len(idle) < self.connections_per_host:
            idle.append(conn)
        else:
            conn.close()

    async def fetch(
        self, request: httpclient.HTTPRequest, raise_error: bool = False
    ) -> httpclient.HTTPResponse:
        """The response, whatever its status; HTTPClientError 599 when the head does not
        answer (as Tornado's client would say)."""
        url = urlsplit(request.url)
        target = url.path + (f"?{url.query}" if url.query else "")
        body = request.body if request.body or request.method in ("POST", "PUT") else None
        try:
            reply = await self.send(
                url.hostname or "",
                url.port or 80,
                request.method,
                target or "/",
                request.headers.get_all(),
                body,
                request.request_timeout or 60.0,
            )
        except HeadGone as exc:
            raise httpclient.HTTPClientError(599, str(exc)) from None
        answer = httputil.HTTPHeaders()
        for name, value in reply.headers:
            answer.add(name, value)
        return httpclient.HTTPResponse(
            request,
            reply.status,
            reason=reply.reason,
            headers=answer,
            buffer=io.BytesIO(reply.body),
            effective_url=request.url,
        )

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def request_head(
    method: str,
    target: str,
    host: str,
    port: int,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
) -> bytes:
    """The request line and headers: the end-to-end ones given (a value with a line break is
    dropped: it would start a header of its own), ``Host``, ``Content-Length`` for a body,
    ``Accept-Encoding: identity`` (pages are rewritten: the storage shim)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower in ("host", "accept-encoding"):
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            continue
        lines.append(f"{name}: {value}")
    lines.append("Accept-Encoding: identity")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
