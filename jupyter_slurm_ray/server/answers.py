"""A head's answer as the dashboard proxy reads it, and what goes wrong with one.

An :class:`HeadAnswer` has its status and end-to-end headers at once and its body as it arrives
(from ``keepalive.py``'s connections); :class:`HeadGone` and its kinds say why there is no
proper answer, each one page of the proxy (503, 504, 502). :func:`end_to_end` is the
hop-by-hop rule, applied to requests and answers alike.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Protocol

#: Per-connection headers (RFC 9110 7.6.1), never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class BodySource(Protocol):
    """Where an answer's body comes from (a connection): told when to read again, or stop."""

    def resume(self) -> None: ...

    def close(self) -> None: ...


class HeadGone(ConnectionError):
    """The head could not be asked or did not answer properly; ``answered``: some of its
    answer had arrived (a request is then never sent again)."""

    def __init__(self, why: str, *, answered: bool = False) -> None:
        super().__init__(why)
        self.answered = answered


class HeadUnreachable(HeadGone):
    """No connection, or the head closed it before answering."""


class HeadSilent(HeadGone):
    """Connected and asked, but no answer within the answer timeout."""


class BadAnswer(HeadGone):
    """The answer is not valid HTTP or breaks a limit."""


def end_to_end(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` without the hop-by-hop ones and without those its ``Connection`` names."""
    headers = list(headers)
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
    }
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() not in named]


class HeadAnswer:
    """A head's answer: status and end-to-end headers at once, the body as it arrives.

    Read the body with :meth:`read` (whole, with a limit) or :meth:`next` (what has arrived);
    :meth:`abandon` when it will not be read to its end (the connection is then closed).
    """

    def __init__(
        self,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        conn: BodySource,
        read_ahead: int,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = end_to_end(headers)
        self.complete = False  # the whole body has arrived
        self.abandoned = False  # its reader stopped reading (the browser left, say)
        self._conn: BodySource | None = conn  # while the body arrives
        self._read_ahead = read_ahead
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._error: HeadGone | None = None
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for n, v in self.headers if n.lower() == lower), None)

    @property
    def content_length(self) -> int | None:
        value = self.header("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def ready(self) -> bytes:
        """The body that has arrived and was not taken yet (maybe nothing)."""
        chunks, self._chunks = self._chunks, deque()
        self._buffered = 0
        if self._conn is not None:
            self._conn.resume()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def next(self) -> bytes:
        """The next bytes of the body, b"" at its end; HeadGone if the head cut it short."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.ready()

    async def read(self, limit: int) -> bytes:
        """The whole body; BadAnswer (and the connection closed) when it exceeds ``limit``."""
        declared = self.content_length
        if declared is not None and declared > limit:
            self.abandon()
            raise BadAnswer(f"its body ({declared} bytes) is larger than {size_text(limit)}")
        parts, size = [], 0
        while chunk := await self.next():
            size += len(chunk)
            if size > limit:
                self.abandon()
                raise BadAnswer(f"its body is larger than {size_text(limit)}")
            parts.append(chunk)
        return b"".join(parts)

    def abandon(self) -> None:
        """Nobody will read the rest: a connection still receiving it is closed."""
        self.abandoned = True
        self._chunks.clear()
        if not self.complete and self._conn is not None:
            self._conn.close()

    # -- from the connection -----------------------------------------------------------------
    def _feed(self, data: bytes) -> bool:
        """Keep ``data``; False when enough is read ahead (the connection pauses)."""
        self._chunks.append(data)
        self._buffered += len(data)
        self._wake()
        return self._buffered < self._read_ahead

    def _end(self) -> None:
        self.complete = True
        self._conn = None
        self._wake()

    def _fail(self, error: HeadGone) -> None:
        if not self.complete:
            self._error = error
            self._conn = None
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def size_text(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 else f"{n // 1024} KB"
