"""The head's Ray dashboard over HTTP, spoken one way by every caller that holds the cluster's
token (the bootstrap's polls, adapt's reader, the server, the Ray Jobs client's settings).

The token travels in one header form (``X-Ray-Authorization: Bearer <token>``) and only to the
address given: requests are made with ``http.client`` itself, which reads no proxy variable
(``http_proxy``, ``https_proxy``, ``all_proxy``, any case), no ``.netrc``, and follows no
redirect (urllib's redirect handler would send the header on to wherever ``Location`` points).
A connect timeout apart from the read timeout bounds each request, and a JSON reply larger
than a limit is refused before it is read whole.

Ray's dashboard speaks plain HTTP. Callers on another host reach it through the head's relay
(``https://``, ``dashrelay.py``): the relay's certificate is checked against the cluster's CA
(``ca_file``) before a byte of the request is sent, so a listener that took the relay's port
gets nothing. The head's own polls go straight to the dashboard, and ``verify_peer`` (called
once the connection is open, before the request) says whether the listener that accepted it
is still the one verified as this job's Ray (``listeners.py``).

Ray's own processes need one thing from the environment (``grpc_exemptions``): loopback in
``no_grpc_proxy``, or Ray's metrics exporter hands the token to the job's proxy.

Standard library only, importing no other bootstrap module: the bootstrap imports it top-level
from the job dir (``from dashhttp import …``), the package as
``jupyter_slurm_ray.bootstrap.dashhttp``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable, Mapping
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


def dashboard_url(host: str, port: int, path: str = "/", *, tls: bool = False) -> str:
    """``http://host:port/path`` (``https`` through the relay; an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/{path.lstrip('/')}"


def tls_context(ca_file: str) -> ssl.SSLContext:
    """What a client of the relay trusts: the cluster's CA only, the address checked."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def get_json(
    url: str,
    token: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
    max_bytes: int = MAX_JSON_BYTES,
    ca_file: str | None = None,
    verify_peer: Callable[[], bool] | None = None,
) -> Any:
    """The decoded JSON body of a 200 answer to ``GET url`` with the token (``url`` is
    ``http(s)://host:port/path?query``); DashboardHTTPError for anything else."""
    status, body = get(
        url,
        token,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_bytes=max_bytes,
        ca_file=ca_file,
        verify_peer=verify_peer,
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
    ca_file: str | None = None,
    verify_peer: Callable[[], bool] | None = None,
) -> tuple[int, bytes]:
    """(status, body) of ``GET url`` with the token, straight to the URL's host and port.

    ``connect_timeout`` bounds opening the connection (and the TLS handshake); ``read_timeout``
    bounds each wait for the status line, the headers or a piece of the body, and the whole
    body gets at most one more wait once it is due; a body over ``max_bytes`` is refused.
    ``https`` needs ``ca_file`` (the cluster's CA: nothing else is trusted). ``verify_peer``:
    called once connected; False closes the connection unused (DashboardHTTPError).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"not a dashboard URL (http(s)://host:port/…): {url!r}")
    if parts.scheme == "https" and not ca_file:
        raise ValueError(f"{url!r}: https needs the cluster's CA (ca_file)")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = _connection(parts.scheme, parts.hostname, parts.port, connect_timeout, ca_file)
    reply: http.client.HTTPResponse | None = None
    try:
        connection.connect()
        if verify_peer is not None and not verify_peer():
            raise DashboardHTTPError(
                f"{_where(url)}: the listener there is not the one verified as this job's Ray"
            )
        connection.sock.settimeout(read_timeout)  # each wait; never touched once replied
        deadline = time.monotonic() + read_timeout
        headers = {**token_headers(token), "Accept": "application/json", "Connection": "close"}
        connection.request("GET", target, headers=headers)
        reply = connection.getresponse()
        return reply.status, _body(reply, deadline, max_bytes)
    except DashboardHTTPError:
        raise
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, garbage
        raise DashboardHTTPError(f"{_where(url)}: {str(exc) or type(exc).__name__}") from None
    finally:
        if reply is not None:
            reply.close()
        connection.close()


def _connection(
    scheme: str, host: str, port: int, timeout: float, ca_file: str | None
) -> http.client.HTTPConnection:
    if scheme == "https":
        assert ca_file is not None
        context = tls_context(ca_file)
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _body(reply: http.client.HTTPResponse, deadline: float, max_bytes: int) -> bytes:
    """The reply's body, read by the deadline and refused beyond ``max_bytes``.

    The socket's timeout (set before the request) bounds each read: the socket is never
    touched once the reply owns it (Ray's dashboard answers ``Connection: close``, and on
    Python 3.13 the reply then closes itself and its socket once the body is read: a read
    after that returns nothing)."""
    declared = reply.getheader("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise DashboardHTTPError(f"a reply of {declared} bytes is over {max_bytes}", reply.status)
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise DashboardHTTPError("the reply took longer than the read timeout", reply.status)
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
