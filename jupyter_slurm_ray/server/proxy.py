"""The Ray dashboard of a registered cluster, proxied behind Jupyter's own login, sandboxed.

``/slurm-ray/dashboard/<id>/<path>`` is a jupyter-server-proxy ``ProxyHandler`` whose backend is
looked up in the registry on every request (see ``backends.py``): the URL names a cluster, never a
host or a port. Jupyter's credentials (``Authorization``, cookies, ``?token=``, the XSRF header)
are stripped before forwarding, and the cluster's Ray token is added server-side as
``X-Ray-Authorization``, so the browser never sees it. Websockets are proxied with the backend
side opened without permessage-deflate: Ray's job-log tail drops compressed connections.

The dashboard's own pages never run on Jupyter's origin, where their scripts could use the
user's Jupyter session. Browsers get them from ``/slurm-ray/dashboard/<id>/~<capability>/``: the
capability is an unguessable path segment, minted for a logged-in user (``POST
/slurm-ray/dashboard-links/<id>``, or a redirect of a browser's navigation to the login-protected
URL), valid in this server process only, for one cluster; it replaces Jupyter's cookie on that
route. Its HTML is served with ``Content-Security-Policy: sandbox`` (without ``allow-same-origin``):
an opaque origin, without Jupyter's cookies or API, whether it is shown in JupyterLab's IFrame
or opened in a browser tab. A small script injected into those pages gives the dashboard an
in-memory ``localStorage`` there (an opaque origin has none, and the dashboard reads it at start).

Since the proxy authenticates to Ray on the user's behalf, writes (POST, PUT, …) authenticated
by Jupyter's login cookie must come from Jupyter's own origin; token-authenticated ones (scripts)
need not. Set-Cookie headers of Ray never reach the browser, on any response path; every
response of both routes, whatever its type (a JSON answer, an image, a download, an error page),
carries the sandbox policy and ``X-Content-Type-Options: nosniff`` (:data:`ROUTE_HEADERS`), so
nothing the head sends can run on Jupyter's origin, even opened as a document of its own.

Plain HTTP goes through the proxy's own kept-alive client (``keepalive.py``) and is relayed
streaming (``relay.py``); jupyter-server-proxy keeps what it does well: websockets, the login
check, its request hooks. A cluster that ended, or whose dashboard does not answer, is a 503
page saying so; an answer that breaks the client's limits a 502, a silent head a 504.
"""

from __future__ import annotations

import html
import logging
import posixpath
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlencode

from jupyter_server_proxy.handlers import ProxyHandler
from jupyter_server_proxy.websocket import PingableWSClientConnection
from tornado import httpclient, httputil, web, websocket

from ..bootstrap.dashhttp import TOKEN_HEADER, tls_context
from ..errors import DashboardUnavailable, NotFound, SlurmRayError
from ..naming import DASHBOARD_ROUTE
from .answers import BadAnswer, HeadAnswer, HeadGone, HeadSilent
from .backends import DashboardBackend, DashboardBackends
from .relay import record_activity, relay


class Capabilities(Protocol):
    """The capability URLs' segments (``capabilities.DashboardCapabilities``)."""

    def mint(self, cluster_id: str) -> str: ...
    def cluster_of(self, capability: str) -> str | None: ...


log = logging.getLogger(__name__)

PREFIX = DASHBOARD_ROUTE

# Request headers that carry Jupyter's (or the browser's) credentials or per-hop state.
_DROPPED_REQUEST_HEADERS = (
    "Authorization",
    "Cookie",
    "X-XSRFToken",
    TOKEN_HEADER,  # only ours goes to the head (backend.token_headers)
    "Sec-WebSocket-Extensions",
    "Host",
)
_DROPPED_QUERY_KEYS = frozenset({"token", "_xsrf"})
_NOT_UP_YET = frozenset({"SUBMITTING", "PENDING", "STARTING"})

#: The dashboard's pages run in an opaque origin: scripts, forms, popups and downloads, but no
#: access to Jupyter's origin (cookies, storage, same-origin requests), nor to the parent page.
SANDBOX_POLICY = "sandbox allow-scripts allow-forms allow-popups allow-downloads"
#: On every response of both routes, whatever its content type.
ROUTE_HEADERS = {
    "Content-Security-Policy": SANDBOX_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def clean_path(path: str) -> str:
    """A proxied path with ``.``/``..`` segments resolved inside the dashboard's root."""
    trailing = path.endswith("/") and path.strip("/") != ""
    cleaned = posixpath.normpath("/" + path.lstrip("/"))
    cleaned = "/" + cleaned.lstrip("/")  # normpath keeps a leading "//"
    return cleaned + "/" if trailing and cleaned != "/" else cleaned


def _only_the_registered_backend(handler: Any, host: str) -> bool:
    """``host_allowlist``: the one host the registry gave for this request, nothing else."""
    backend = getattr(handler, "backend", None)
    return backend is not None and host == backend.host


class DashboardError(web.HTTPError):
    """An error answered with a short HTML page that says what happened (never a traceback)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        self.retry_after = retry_after


def error_page(status: int, message: str) -> str:
    """The short HTML page of a :class:`DashboardError`."""
    reason = httputil.responses.get(status, "Error")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Ray dashboard: {status} {html.escape(reason)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:48em;"
        "line-height:1.4}code{font-size:1.05em}</style></head>\n"
        f"<body><h1>Ray dashboard unavailable</h1>\n<p>{_markup(message)}</p></body></html>\n"
    )


def _markup(message: str) -> str:
    """Escaped text where `backquoted` parts become <code>."""
    parts = html.escape(message, quote=False).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def client_uri(origin: str, proxied_path: str, query: str) -> str:
    """The head's URL for a proxied path: ``..`` resolved inside the dashboard's root, Jupyter's
    ``token`` and ``_xsrf`` left out of the query."""
    path = quote(clean_path(proxied_path), safe=":/@!$&'()*+,;=-._~")
    kept = [
        (key, value)
        for key, value in parse_qsl(query, keep_blank_values=True)
        if key not in _DROPPED_QUERY_KEYS
    ]
    return f"{origin}{path}?{urlencode(kept)}" if kept else f"{origin}{path}"


def backend_target(proxied_path: str, query: str) -> str:
    """The request target (path and query) of a proxied path at the head."""
    return client_uri("", proxied_path, query)


def unavailable(
    backends: DashboardBackends, cluster_id: str, exc: DashboardUnavailable
) -> DashboardError:
    """503 with what the registry (and Slurm) said: ended, not up yet, unreadable, …"""
    message = str(exc).rstrip(".")
    if message.startswith("cluster "):
        message = "Ray " + message
    record = _record(backends, cluster_id)
    starting = record is not None and record.state in _NOT_UP_YET
    return DashboardError(503, message[:1].upper() + message[1:] + ".", 5 if starting else None)


def head_failed(backends: DashboardBackends, cluster_id: str, exc: HeadGone) -> DashboardError:
    """The page for a head that gave no proper answer, naming the cluster: 502 for an answer
    the client refuses (not HTTP, over a limit), 504 for no answer in time, else 503."""
    who, state = _who(backends, cluster_id)
    if isinstance(exc, BadAnswer):
        log.warning("the dashboard of %s sent a refused answer: %s", cluster_id, exc)
        return DashboardError(
            502, f"The dashboard of {who} sent an answer the proxy refuses: {exc}."
        )
    if isinstance(exc, HeadSilent):
        log.warning("the dashboard of %s is silent: %s", cluster_id, exc)
        return DashboardError(
            504,
            f"The dashboard of {who} accepted the request but sent {exc}: "
            "its head node may be overloaded or stalled.",
        )
    log.warning("the dashboard of %s does not answer: %s", cluster_id, exc)
    backends.forget(cluster_id)  # the next request reads connection.json again
    return DashboardError(
        503,
        f"{who} was last seen {state}, but its dashboard does not answer: the job may "
        "have ended, or its head node cannot be reached.",
        retry_after=10,
    )


def _who(backends: DashboardBackends, cluster_id: str) -> tuple[str, str]:
    """How a page names the cluster, and its last known state."""
    record = _record(backends, cluster_id)
    if record is None:
        return f"Ray cluster `{cluster_id}`", "unknown"
    job = f" (job {record.job_id})" if record.job_id else ""
    return f"Ray cluster `{record.name}`{job}", record.state


def _record(backends: DashboardBackends, cluster_id: str) -> Any:
    try:
        return backends.registry.load(cluster_id)
    except (SlurmRayError, OSError):
        return None


class _ResponseGuard(web.OutputTransform):
    """The last look at a response's headers before they go out, whatever path made them.

    jupyter-server-proxy copies the backend's headers in several places (buffered responses,
    event streams, redirects); Tornado adds its own cookies (Jupyter's login) only after the
    transforms, so removing ``Set-Cookie`` here removes exactly the backend's.
    """

    def __init__(self, handler: _DashboardProxy) -> None:
        self.handler = handler

    def transform_first_chunk(
        self, status_code: int, headers: httputil.HTTPHeaders, chunk: bytes, finishing: bool
    ) -> tuple[int, httputil.HTTPHeaders, bytes]:
        if "Set-Cookie" in headers:
            del headers["Set-Cookie"]
        for name, value in self.handler.response_headers(headers).items():
            headers[name] = value
        return status_code, headers, chunk


class _DashboardProxy(ProxyHandler):
    """Proxies HTTP and websockets to the dashboard of the cluster named in the URL.

    Subclasses say how a request is authorized (:meth:`_authorize`) and where the dashboard's
    root is in the URL (:meth:`_root`).
    """

    backend: DashboardBackend | None = None
    answer: HeadAnswer | None = None  # the head's, while it is relayed
    cluster_id: str = ""
    proxied_path: str = "/"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("host_allowlist", _only_the_registered_backend)
        kwargs.setdefault("absolute_url", False)
        super().__init__(*args, **kwargs)

    def initialize(self, backends: DashboardBackends, capabilities: Capabilities) -> None:
        self.backends = backends
        self.capabilities = capabilities

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        self._transforms.append(_ResponseGuard(self))
        self.cluster_id = self.path_args[0]
        self.proxied_path = self.path_args[-1] or "/"
        if not await self._authorize():
            return
        if self.request.method == "OPTIONS" and self._answer_preflight():
            return
        try:
            self.backend = await self.backends.resolve(self.cluster_id)
        except NotFound:
            raise DashboardError(404, f"There is no Ray cluster `{self.cluster_id}`.") from None
        except DashboardUnavailable as exc:
            raise self._unavailable(exc) from None

    async def _authorize(self) -> bool:
        """Authorize the request (raise, or answer it and return False)."""
        raise NotImplementedError

    def _answer_preflight(self) -> bool:
        """HeadAnswer a CORS preflight here instead of forwarding it (True when answered)."""
        return False

    def _root(self) -> str:
        """The URL path of the dashboard's root for this request (ends without a slash)."""
        raise NotImplementedError

    def response_headers(self, headers: httputil.HTTPHeaders) -> dict[str, str]:
        """Headers set on every response (see :class:`_ResponseGuard`)."""
        return dict(ROUTE_HEADERS)

    # -- what a browser sees when the dashboard is not there ------------------------------
    def _unavailable(self, exc: DashboardUnavailable) -> DashboardError:
        return unavailable(self.backends, self.cluster_id, exc)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if not isinstance(exc, DashboardError):
            return super().write_error(status_code, **kwargs)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        if exc.retry_after:
            self.set_header("Retry-After", str(exc.retry_after))
        self.finish(error_page(status_code, exc.message))

    # -- what is forwarded ----------------------------------------------------------------
    def proxy_request_headers(self) -> httputil.HTTPHeaders:
        headers = super().proxy_request_headers()
        for name in _DROPPED_REQUEST_HEADERS:
            headers.pop(name, None)
        assert self.backend is not None
        headers["Host"] = f"{self.backend.host}:{self.backend.port}"
        headers.update(self.backend.token_headers())
        return headers

    def get_client_uri(self, protocol: str, host: str, port: int, proxied_path: str) -> str:
        return client_uri(f"{protocol}://{host}:{port}", proxied_path, self.request.query)

    def _get_context_path(self, host: str, port: int) -> str:
        return self._root()

    # -- HTTP verbs -----------------------------------------------------------------------
    async def _forward(self) -> None:
        backend = self.backend
        assert backend is not None
        await self.proxy(backend.host, backend.port, self.proxied_path)

    async def proxy(self, host: str, port: int, proxied_path: str) -> None:
        """jupyter-server-proxy's checks and request hooks, then the request over the proxy's
        kept-alive connections and the answer relayed as it arrives."""
        if not self._check_host_allowlist(host):
            raise web.HTTPError(403, f"host {host!r} is not this cluster's dashboard")
        record_activity(self)
        method = self.request.method or "GET"
        body = self.request.body or (b"" if method in ("POST", "PUT") else None)
        target = client_uri("", proxied_path, self.request.query)
        headers = self.proxy_request_headers().get_all()
        try:
            self.answer = await self.backends.client.request(
                host, port, method, target, headers, body
            )
            await relay(
                self,
                self.answer,
                lambda location: self._rewrite_location_header(location, host, port, proxied_path),
            )
        except HeadGone as exc:  # refused, reset, silent, refused answer: nothing sent yet
            raise head_failed(self.backends, self.cluster_id, exc) from None

    def compute_etag(self) -> None:
        """The head's own ETag (and its answer to If-None-Match) is relayed; none added."""
        return None

    def on_connection_close(self) -> None:
        if self.answer is not None:  # the browser left: so does the request to the head
            self.answer.abandon()
        super().on_connection_close()

    async def _forward_any(self, *args: Any) -> None:
        await self._forward()

    http_get = post = put = delete = patch = head = options = _forward_any

    # -- websockets -----------------------------------------------------------------------
    async def open(self, *args: Any) -> None:
        """Connect the backend side of a websocket, uncompressed, and relay both ways."""
        backend = self.backend
        assert backend is not None
        tls = backend.tls_ca is not None  # the head's relay: its certificate, the cluster's CA
        request = httpclient.HTTPRequest(
            url=self.get_client_uri(
                "wss" if tls else "ws", backend.host, backend.port, self.proxied_path
            ),
            headers=self.proxy_request_headers(),
            ssl_options=tls_context(backend.tls_ca) if backend.tls_ca is not None else None,
        )
        self._record_activity()
        conn = PingableWSClientConnection(
            request=httpclient._RequestProxy(request, httpclient.HTTPRequest._DEFAULTS),
            compression_options=None,
            on_message_callback=self._from_backend,
            on_ping_callback=self._ping_from_backend,
            max_message_size=websocket._default_max_message_size,
            subprotocols=self._requested_subprotocols,
        )
        try:
            self.ws = await conn.connect_future
        except (OSError, httpclient.HTTPClientError, websocket.WebSocketClosedError) as exc:
            log.warning("dashboard websocket of %s failed: %s", self.cluster_id, exc)
            self.close(1011, "the Ray dashboard refused the websocket")

    def _from_backend(self, message: str | bytes | None) -> None:
        self._record_activity()
        if message is None:
            self._close_like_backend()
        else:
            self.write_message(message, binary=isinstance(message, bytes))

    def _close_like_backend(self) -> None:
        """Close the browser's side with the head's close code and reason: Ray's Jobs CLI
        (aiohttp) takes a close without a code for a lost connection (1006) and fails the
        ``ray job submit`` whose log tail just ended normally."""
        backend = getattr(self, "ws", None)
        code = getattr(backend, "close_code", None)
        reason = getattr(backend, "close_reason", None) if code is not None else None
        self.close(code, reason)

    def _ping_from_backend(self, data: bytes) -> None:
        self._record_activity()
        self.ping(data)
