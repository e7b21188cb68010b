"""Kept-alive HTTP/1.1 connections from the Jupyter server to the dashboards, for the proxy.

A small pool of asyncio connections per head whose answers ``httptools`` (llhttp, the parser of
Node.js and uvicorn) parses; the body of an answer is handed over as it arrives, with reading
paused while the browser is slower than the head, so a log of many GB or a never-ending log
stream goes through in bounded memory. The rules of a careful client:

- **limits**: the status line and headers of an answer (bytes and count), how many interim
  (1xx) answers may come first; a body the proxy must hold whole (a page it rewrites) is
  limited by its caller (``HeadAnswer.read``). Broken ones are :class:`BadAnswer` (a 502).
- **timeouts**: connecting (:class:`HeadUnreachable`, a 503) apart from waiting for the answer
  once the request is sent (:class:`HeadSilent`, a 504). A streamed body has no timeout between
  its reads (a log stream may be quiet for hours): the browser going away ends it, and TCP
  keepalive notices a head that vanished.
- **interim answers** (100 Continue, 102, 103 Early Hints) are skipped, never taken for the
  final answer; a 101 to a plain request is refused.
- **desynchronisation**: a connection on which anything arrives beyond the answer to the
  request in flight (extra bytes, a second answer, bytes while idle) is closed, never reused
  (llhttp skips blank lines right after an answer, as HTTP asks clients to: only those pass).
- **hop-by-hop headers** (and those named in ``Connection:``) are dropped both ways.
- **the pool** keeps idle connections 15 s at most, drops one the head closed at once, and is
  emptied for a head when the proxy forgets it (:meth:`KeepAliveClient.drop`).

Why not a maintained client: aiohttp's ``ClientSession`` (which this environment has) hands an
answer the head sent while the connection sat idle in its pool to the next request
(aio-libs/aiohttp#13656, still so in 3.14.5), and costs more CPU per proxied request (see
docs/explanation/performance.md); Tornado's curl client needs pycurl and bounds a request's whole
duration. llhttp does the parsing; this module keeps only the pool and the rules above.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httptools

from ..bootstrap.dashhttp import tls_context
from .answers import (
    BadAnswer,
    HeadAnswer,
    HeadGone,
    HeadSilent,
    HeadUnreachable,
    end_to_end,
    size_text,
)

# What the request head sets itself, whatever the browser sent.
_SET_HERE = frozenset({"host", "content-length", "expect", "accept-encoding"})
_RETRIED = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})  # idempotent methods


@dataclass(frozen=True)
class Limits:
    """What the proxy accepts from a head, and how long it waits."""

    connect_seconds: float = 10.0  # the TCP connection to the head (or to our forward)
    answer_seconds: float = 60.0  # request sent → the final status line and headers
    header_bytes: int = 64 * 1024  # status line and headers of an answer, interim ones included
    header_count: int = 128
    interim_answers: int = 8  # 1xx answers before the final one
    read_ahead_bytes: int = 256 * 1024  # body read ahead of the browser before reading pauses
    idle_seconds: float = 15.0  # an idle connection kept longer is closed (Ray's: 75 s)
    connections_per_host: int = 32  # idle connections kept per head


DEFAULT_LIMITS = Limits()


class _Stop(Exception):
    """Raised in a parser callback to stop parsing (httptools wraps it)."""


class _Connection(asyncio.Protocol):
    """One connection to a head, one request at a time; llhttp's callbacks fill an HeadAnswer."""

    def __init__(self, pool: KeepAliveClient, key: tuple[str, int], epoch: int) -> None:
        self.pool = pool
        self.key = key
        self.epoch = epoch  # the pool's epoch for this head when it was made (see drop)
        self.limits = pool.limits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = time.monotonic()
        self.idle_timer: asyncio.TimerHandle | None = None
        self._keep_alive = False
        self._in_flight = False  # a request whose answer has not fully arrived
        self._answer: HeadAnswer | None = None
        self._headers_ready: asyncio.Future[HeadAnswer] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._method = ""
        self._reason = ""
        self._headers: list[tuple[str, str]] = []
        self._received = 0  # bytes of this exchange before its final headers
        self._header_bytes = 0  # status lines and headers of this exchange, as parsed
        self._interim = 0
        self._in_interim = False
        self._refused: HeadGone | None = None

    # -- asyncio ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _keep_alive_probes(sock)

    def data_received(self, data: bytes) -> None:
        if not self._in_flight:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        if self._answer is None:
            self._received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self._in_flight:  # bytes beyond its answer (a second one…): desync
                self.close()
                return
            self._refuse(BadAnswer(f"it is not valid HTTP ({exc})", answered=True))
        if self._refused is not None:
            self._fail(self._refused)
        elif self._answer is None and self._received > self.limits.header_bytes:
            self._fail(self._headers_too_large())  # one that never ends, say
        elif not self._in_flight and not self.closed:
            self.pool._put_back(self, self._keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)
        if not self._in_flight:
            return
        answer = self._answer
        if answer is not None and self._delimited_by_close():
            self._in_flight = False
            answer._end()
        else:
            why = "in the middle of its answer" if answer is not None else "before answering"
            error = HeadUnreachable(
                f"the dashboard closed the connection {why} ({exc or 'EOF'})",
                answered=self._received > 0,
            )
            self._fail(error)

    def pause(self) -> None:
        if self.transport is not None and self.transport.is_reading():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed and not self.transport.is_reading():
            self.transport.resume_reading()

    # -- llhttp's callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if not self._in_flight or (self._answer is not None and self._answer.complete):
            raise _Stop  # a second answer to one request: desync
        self._reason, self._headers = "", []

    def on_status(self, status: bytes) -> None:
        self._reason += status.decode("latin-1")
        self._header_bytes += len(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))
        self._header_bytes += len(name) + len(value) + 4
        if len(self._headers) > self.limits.header_count:
            self._refuse(BadAnswer(f"it has more than {self.limits.header_count} headers"))
            raise _Stop
        if self._header_bytes > self.limits.header_bytes:
            self._refuse(self._headers_too_large())
            raise _Stop

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status == 101:  # llhttp stops after it
            self._refuse(BadAnswer("it switched protocols (101) on a plain request"))
            return
        if 100 <= status < 200:  # 100 Continue, 102 Processing, 103 Early Hints…: skipped
            self._interim += 1
            self._in_interim = True
            if self._interim > self.limits.interim_answers:
                self._refuse(BadAnswer(f"more than {self.limits.interim_answers} 1xx answers"))
                raise _Stop
            return
        self._cancel_timer()
        self._keep_alive = self.parser.should_keep_alive() and self._method != "HEAD"
        reason, ahead = self._reason.strip(), self.limits.read_ahead_bytes
        self._answer = HeadAnswer(status, reason, self._headers, self, ahead)
        assert self._headers_ready is not None
        if not self._headers_ready.done():
            self._headers_ready.set_result(self._answer)
        if self._method == "HEAD":  # its answer has no body (llhttp cannot be told)
            self._message_complete()
            raise _Stop

    def on_body(self, body: bytes) -> None:
        assert self._answer is not None
        if not self._answer._feed(body):
            self.pause()

    def on_message_complete(self) -> None:
        if self._in_interim:
            self._in_interim = False
        elif self._answer is not None:
            self._message_complete()

    # -- the exchange ----------------------------------------------------------------------
    async def exchange(self, head: bytes, body: bytes | None, method: str) -> HeadAnswer:
        """Send a request; the answer once its final headers are in."""
        assert self.transport is not None and not self._in_flight
        loop = asyncio.get_running_loop()
        self._in_flight, self._method = True, method
        self._answer, self._received, self._interim, self._refused = None, 0, 0, None
        self._header_bytes = 0
        self._headers_ready = loop.create_future()
        self._timer = loop.call_later(self.limits.answer_seconds, self._silent)
        self.transport.write(head + body if body else head)
        try:
            return await self._headers_ready
        except BaseException:  # failed, timed out, cancelled: its state is unknown
            self.close()
            raise

    def _message_complete(self) -> None:
        assert self._answer is not None
        self._in_flight = False
        self._answer._end()
        self.resume()  # it may have paused for this answer: an idle connection reads

    def _delimited_by_close(self) -> bool:
        """Whether the answer's body ends with the connection (no length, not chunked)."""
        assert self._answer is not None
        chunked = "chunked" in (self._answer_header_raw("transfer-encoding") or "").lower()
        return self._answer_header_raw("content-length") is None and not chunked

    def _answer_header_raw(self, lower: str) -> str | None:
        return next((v for n, v in self._headers if n.lower() == lower), None)

    def _headers_too_large(self) -> BadAnswer:
        return BadAnswer(f"its headers are larger than {size_text(self.limits.header_bytes)}")

    def _silent(self) -> None:
        seconds = self.limits.answer_seconds
        self._fail(HeadSilent(f"no answer within {seconds:g} s"))

    def _refuse(self, error: HeadGone) -> None:
        if self._refused is None:
            self._refused = error

    def _fail(self, error: HeadGone) -> None:
        self._cancel_timer()
        if self._in_flight:
            self._in_flight = False
            if self._headers_ready is not None and not self._headers_ready.done():
                self._headers_ready.set_exception(error)
            elif self._answer is not None:
                self._answer._fail(error)
        self.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        if self._in_flight:  # connection_lost comes later: fail what waits now
            self._fail(HeadUnreachable("the connection to the dashboard was closed", answered=True))


class KeepAliveClient:
    """Pooled, kept-alive HTTP/1.1 connections to the heads."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or DEFAULT_LIMITS
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._epochs: dict[tuple[str, int], int] = {}
        self._tls: dict[tuple[str, int], tuple[str, ssl.SSLContext]] = {}

    def use_tls(self, host: str, port: int, ca_file: str) -> None:
        """Connections to host:port speak TLS, the certificate checked against ``ca_file``
        (and the address), before a byte of a request is sent."""
        known = self._tls.get((host, port))
        if known is None or known[0] != ca_file:
            self._tls[(host, port)] = (ca_file, tls_context(ca_file))

    async def request(
        self,
        host: str,
        port: int,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None = None,
    ) -> HeadAnswer:
        """Send one request (``target``: path and query) and return its answer once its final
        headers are in; HeadGone (a subclass saying why) if there is none."""
        head = request_head(method, target, host, port, headers, body)
        reused = self._take_idle((host, port))
        if reused is not None:
            try:
                return await reused.exchange(head, body, method)
            except HeadUnreachable as exc:  # closed by the head while idle: once more, afresh
                if exc.answered or method not in _RETRIED:
                    raise
        conn = await self._connect(host, port)
        return await conn.exchange(head, body, method)

    async def _connect(self, host: str, port: int) -> _Connection:
        key = (host, port)
        epoch = self._epochs.get(key, 0)
        loop = asyncio.get_running_loop()
        seconds = self.limits.connect_seconds
        tls = self._tls.get(key)
        context = tls[1] if tls is not None else None
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self, key, epoch), host, port, ssl=context
                ),
                seconds,
            )
        except asyncio.TimeoutError:
            raise HeadUnreachable(f"no connection to {host}:{port} within {seconds:g} s") from None
        except OSError as exc:
            raise HeadUnreachable(f"cannot connect to {host}:{port}: {exc}") from None
        return conn

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.limits.idle_seconds:
                if conn.idle_timer is not None:
                    conn.idle_timer.cancel()
                    conn.idle_timer = None
                return conn
            conn.close()
        return None

    def _put_back(self, conn: _Connection, keep_alive: bool) -> None:
        idle = self._idle.setdefault(conn.key, [])
        current = conn.epoch == self._epochs.get(conn.key, 0)
        if keep_alive and current and len(idle) < self.limits.connections_per_host:
            conn.idle_since = time.monotonic()
            loop = asyncio.get_running_loop()
            conn.idle_timer = loop.call_later(self.limits.idle_seconds, conn.close)
            idle.append(conn)
        else:
            conn.close()

    def _lost(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def idle(self, host: str, port: int) -> int:
        """How many idle connections to ``host:port`` the pool holds."""
        return len(self._idle.get((host, port), []))

    def drop(self, host: str, port: int) -> None:
        """Close the idle connections to a head; those in use are closed when done."""
        key = (host, port)
        self._tls.pop(key, None)
        self._epochs[key] = self._epochs.get(key, 0) + 1
        for conn in self._idle.pop(key, []):
            conn.close()

    async def close(self) -> None:
        for key in list(self._idle):
            self.drop(*key)


def request_head(
    method: str,
    target: str,
    host: str,
    port: int,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
) -> bytes:
    """The request line and headers: the end-to-end ones given (a name or value with a line
    break is dropped: it would start a header of its own), ``Host``, ``Content-Length`` for a
    body, ``Accept-Encoding: identity`` (pages are rewritten: the storage shim)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
    for name, value in end_to_end(headers):
        if name.lower() in _SET_HERE:
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            continue
        lines.append(f"{name}: {value}")
    lines.append("Accept-Encoding: identity")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _keep_alive_probes(sock: socket.socket) -> None:
    """TCP keepalive: a head that vanished (node down, no reset) is noticed in about 2 min
    even while a quiet stream waits on it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
