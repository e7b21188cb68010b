"""The head's Ray dashboard over HTTP, spoken one way by every caller that holds the cluster's
token (the bootstrap's polls, adapt's reader, the server, the Ray Jobs client's settings).

The token travels in one header form (``X-Ray-Authorization: Bearer <token>``) and only to the
address given: requests are made with ``http.client`` itself, which reads no proxy variable
(``http_proxy``, ``https_proxy``, ``all_proxy``, any case), no ``.netrc``, and follows no
redirect (urllib's redirect handler would send the header on to wherever ``Location`` points).
A connect timeout apart from the read timeout bounds each request, and a JSON reply larger
than a limit is refused before it is read whole.

Ray's own processes need one thing from the environment (``grpc_exemptions``): loopback in
``no_grpc_proxy``, or Ray's metrics exporter hands the token to the job's proxy.

Standard library only, importing no other bootstrap module: the bootstrap imports it top-level
from the job dir (``from dashhttp import …``), the package as
``jupyter_slurm_ray.bootstrap.dashhttp``.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

TOKEN_HEADER = "X-Ray-Authorization"
CONNECT_TIMEOUT = 2.0  # seconds to open the connection
READ_TIMEOUT = 5.0  # seconds for each wait for the headers, and for the whole body
MAX_JSON_BYTES = 16 * 1024 * 1024  # room for the state API's answer about 1,000 nodes
_CHUNK = 64 * 1024
GRPC_PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")  # what gRPC reads, in order
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class DashboardHTTPError(OSError):
    """The dashboard gave no usable answer: refused, timed out, an HTTP error status, a reply
    too large or not JSON. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def token_headers(token: str) -> dict[str, str]:
    """The header that carries the cluster's token to Ray's dashboard (the only form sent)."""
    return {TOKEN_HEADER: f"Bearer {token}"}


def dashboard_url(host: str, port: int, path: str = "/") -> str:
    """``http://host:port/path`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/{path.lstrip('/')}"


def get_json(
    url: str,
    token: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
    max_bytes: int = MAX_JSON_BYTES,
) -> Any:
    """The decoded JSON body of a 200 answer to ``GET url`` with the token (``url`` is
    ``http://host:port/path?query``); DashboardHTTPError for anything else."""
    status, body = get(
        url, token, connect_timeout=connect_timeout, read_timeout=read_timeout, max_bytes=max_bytes
    )
    if status != 200:
        raise DashboardHTTPError(f"{_where(url)} answered HTTP {status}", status)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise DashboardHTTPError(
            f"{_where(url)} answered something not JSON: {exc}", status
        ) from None


def get(
    url: str,
    token: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
    max_bytes: int = MAX_JSON_BYTES,
) -> tuple[int, bytes]:
    """(status, body) of ``GET url`` with the token, straight to the URL's host and port.

    ``connect_timeout`` bounds opening the connection; ``read_timeout`` bounds each wait for
    the status line and headers, and the whole body; a body over ``max_bytes`` is refused.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"not a dashboard URL (http://host:port/…): {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=connect_timeout)
    reply: http.client.HTTPResponse | None = None
    try:
        connection.connect()
        deadline = time.monotonic() + read_timeout
        sock = connection.sock  # kept: the reply owns it once the headers say "close"
        sock.settimeout(read_timeout)
        headers = {**token_headers(token), "Accept": "application/json", "Connection": "close"}
        connection.request("GET", target, headers=headers)
        reply = connection.getresponse()
        return reply.status, _body(reply, sock, deadline, max_bytes)
    except DashboardHTTPError:
        raise
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, garbage
        raise DashboardHTTPError(f"{_where(url)}: {str(exc) or type(exc).__name__}") from None
    finally:
        if reply is not None:
            reply.close()
        connection.close()


def _body(
    reply: http.client.HTTPResponse, sock: socket.socket, deadline: float, max_bytes: int
) -> bytes:
    """The reply's body, read by the deadline and refused beyond ``max_bytes``."""
    declared = reply.getheader("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise DashboardHTTPError(f"a reply of {declared} bytes is over {max_bytes}", reply.status)
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DashboardHTTPError("the reply took longer than the read timeout", reply.status)
        sock.settimeout(left)
        chunk = reply.read1(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise DashboardHTTPError(f"a reply over {max_bytes} bytes", reply.status)
        chunks.append(chunk)


def _where(url: str) -> str:
    """The dashboard and path a message names (no query)."""
    parts = urlsplit(url)
    return f"the dashboard at {parts.netloc}{parts.path}"


def grpc_exemptions(env: Mapping[str, str]) -> dict[str, str]:
    """What Ray's processes need added to ``env`` so that no gRPC call to this node's own
    loopback goes through a proxy: ``no_grpc_proxy`` as gRPC reads it now (``no_grpc_proxy``,
    else ``no_proxy``) plus the loopback names; nothing when ``env`` names no proxy for gRPC.

    Ray 2.60's metrics exporter (OpenTelemetry's OTLP gRPC client in the raylet, the GCS and
    every worker) sends ``authorization: Bearer <token>`` to the node's dashboard agent on
    127.0.0.1 every few seconds and, unlike Ray's own channels, honours ``grpc_proxy``,
    ``https_proxy`` and ``http_proxy``: with a proxy in the job's environment (a site's module
    sets one) the token went to that proxy. Every other variable, and every other host, is
    left to the proxy settings the job has.
    """
    if not any(env.get(name) for name in GRPC_PROXY_VARIABLES):
        return {}
    current = env["no_grpc_proxy"] if "no_grpc_proxy" in env else env.get("no_proxy", "")
    entries = [entry.strip() for entry in current.split(",") if entry.strip()]
    return {"no_grpc_proxy": ",".join([*entries, *(h for h in LOOPBACK if h not in entries)])}
