"""Kept-alive connections from the Jupyter server to the dashboards, for the proxy.

jupyter-server-proxy opens a new connection (and resolves the host in a thread) for every
proxied request, which costs more than the request itself on a dashboard API call. This client
keeps connections to each head alive across requests: an aiohttp session (aiohttp comes with
``ray[default]``) behind the ``fetch(request)`` that jupyter-server-proxy's buffered path
calls, so its response handling (rewrites, ``Location`` headers) is used unchanged. Written
here because Tornado's own client does not keep connections alive.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

from tornado import httpclient, httputil

# Per-request headers of the hop to the head, not the end-to-end request's.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade"})


class KeepAliveClient:
    """A ``tornado.httpclient``-like ``fetch`` over pooled, kept-alive connections."""

    def __init__(self, connections_per_host: int = 32) -> None:
        self.connections_per_host = connections_per_host
        self._session: Any = None

    def _client(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit_per_host=self.connections_per_host, keepalive_timeout=30, ttl_dns_cache=300
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def fetch(
        self, request: httpclient.HTTPRequest, raise_error: bool = False
    ) -> httpclient.HTTPResponse:
        """The response, whatever its status; HTTPClientError 599 when the head does not
        answer (as Tornado's client would say)."""
        import aiohttp

        headers = [
            (name, value)
            for name, value in request.headers.get_all()
            if name.lower() not in _HOP_BY_HOP and name.lower() != "accept-encoding"
        ]
        headers.append(("Accept-Encoding", "identity"))  # pages are rewritten (storage shim)
        timeout = aiohttp.ClientTimeout(
            total=request.request_timeout, connect=request.connect_timeout
        )
        try:
            async with self._client().request(
                request.method,
                request.url,
                headers=headers,
                data=request.body,
                allow_redirects=False,
                timeout=timeout,
            ) as reply:
                body = await reply.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise httpclient.HTTPClientError(599, f"{type(exc).__name__}: {exc}") from None
        answer = httputil.HTTPHeaders()
        for name, value in reply.raw_headers:
            answer.add(name.decode("latin-1"), value.decode("latin-1"))
        return httpclient.HTTPResponse(
            request,
            reply.status,
            reason=reply.reason,
            headers=answer,
            buffer=io.BytesIO(body),
            effective_url=request.url,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
