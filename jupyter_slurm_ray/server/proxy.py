"""The Ray dashboard of a registered cluster, proxied behind Jupyter's own login.

``/slurm-ray/dashboard/<id>/<path>`` is a jupyter-server-proxy ``ProxyHandler`` whose target is
looked up in the registry on every request (see ``targets.py``): the URL names a cluster, never a
host or a port. Jupyter's credentials (``Authorization``, cookies, ``?token=``, the XSRF header)
are stripped before forwarding, and the cluster's Ray token is added server-side as
``X-Ray-Authorization``, so the browser never sees it. Websockets are proxied with the backend
side opened without permessage-deflate: Ray's job-log tail drops compressed connections.
Since the proxy authenticates to Ray on the user's behalf, writes (POST, PUT, …) authenticated
by Jupyter's cookie must come from Jupyter's own origin.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from jupyter_server.utils import url_path_join
from jupyter_server_proxy.handlers import ProxyHandler, RewritableResponse
from jupyter_server_proxy.websocket import PingableWSClientConnection
from tornado import httpclient, httputil, web, websocket

from .targets import DashboardTarget, DashboardTargets, DashboardUnavailable, UnknownCluster

log = logging.getLogger(__name__)

PREFIX = "slurm-ray/dashboard"

# Request headers that carry Jupyter's (or the browser's) credentials or per-hop state.
_DROPPED_REQUEST_HEADERS = (
    "Authorization",
    "Cookie",
    "X-XSRFToken",
    "X-Ray-Authorization",
    "Sec-WebSocket-Extensions",
    "Host",
)
_DROPPED_QUERY_KEYS = frozenset({"token", "_xsrf"})


def _only_registered_target(handler: Any, host: str) -> bool:
    """``host_allowlist``: the one host the registry gave for this request, nothing else."""
    target = getattr(handler, "target", None)
    return target is not None and host == target.host


def _drop_backend_cookies(response: RewritableResponse) -> None:
    """Ray's dashboard cookies hold its token: they stay between the proxy and Ray."""
    headers = httputil.HTTPHeaders()
    for name, value in response.headers.get_all():
        if name.lower() != "set-cookie":
            headers.add(name, value)
    response.headers = headers


def clean_path(path: str) -> str:
    """A proxied path with ``.``/``..`` segments resolved inside the dashboard's root."""
    trailing = path.endswith("/") and path.strip("/") != ""
    cleaned = posixpath.normpath("/" + path.lstrip("/"))
    cleaned = "/" + cleaned.lstrip("/")  # normpath keeps a leading "//"
    return cleaned + "/" if trailing and cleaned != "/" else cleaned


class DashboardProxyHandler(ProxyHandler):
    """Proxies HTTP and websockets to the dashboard of the cluster named in the URL."""

    target: DashboardTarget | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("host_allowlist", _only_registered_target)
        kwargs.setdefault("absolute_url", False)
        kwargs.setdefault("rewrite_response", (_drop_backend_cookies,))
        super().__init__(*args, **kwargs)

    def initialize(self, targets: DashboardTargets) -> None:  # type: ignore[override]
        self.targets = targets

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        await super().prepare(*args, **kwargs)  # Jupyter auth: 302 / 403 without it
        if self._finished:  # redirected to the login page
            return
        self._refuse_cross_site_writes()
        cluster_id = self.path_args[0]
        try:
            self.target = await self.targets.resolve(cluster_id)
        except UnknownCluster:
            raise web.HTTPError(404, f"no Ray cluster {cluster_id!r}") from None
        except DashboardUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None

    def _refuse_cross_site_writes(self) -> None:
        """CSRF: the proxy adds the Ray token, so a write must come from Jupyter's own origin.

        Jupyter's XSRF token is not required (the dashboard's own page does not send it); a
        browser's write carries ``Origin`` (or at least ``Referer``), which must be this server.
        Requests with an ``Authorization`` header are scripts, not a browser's ambient cookie.
        """
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            return
        if self.request.headers.get("Authorization"):
            return
        headers = self.request.headers
        source = headers.get("Origin") or headers.get("Referer")
        if source is None or urlsplit(source).netloc != headers.get("Host"):
            raise web.HTTPError(403, f"cross-site {self.request.method} refused (from {source})")

    # -- what is forwarded ----------------------------------------------------------------
    def proxy_request_headers(self) -> httputil.HTTPHeaders:
        headers = super().proxy_request_headers()
        for name in _DROPPED_REQUEST_HEADERS:
            headers.pop(name, None)
        assert self.target is not None
        headers["Host"] = f"{self.target.host}:{self.target.port}"
        headers["X-Ray-Authorization"] = f"Bearer {self.target.token}"
        return headers

    def get_client_uri(self, protocol: str, host: str, port: int, proxied_path: str) -> str:
        path = quote(clean_path(proxied_path), safe=":/@!$&'()*+,;=-._~")
        query = [
            (key, value)
            for key, value in parse_qsl(self.request.query, keep_blank_values=True)
            if key not in _DROPPED_QUERY_KEYS
        ]
        uri = f"{protocol}://{host}:{port}{path}"
        return f"{uri}?{urlencode(query)}" if query else uri

    def _get_context_path(self, host: str, port: int) -> str:
        return url_path_join(self.base_url, PREFIX, self.path_args[0])

    # -- HTTP verbs -----------------------------------------------------------------------
    async def _forward(self) -> None:
        assert self.target is not None
        path = self.path_args[1] if len(self.path_args) > 1 else "/"
        await self.proxy(self.target.host, self.target.port, path or "/")

    async def http_get(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    async def post(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    async def put(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    async def delete(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    async def patch(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    async def head(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    async def options(self, cluster_id: str, path: str = "/") -> None:
        await self._forward()

    # -- websockets -----------------------------------------------------------------------
    async def open(self, cluster_id: str, path: str = "/") -> None:
        """Connect the backend side of a websocket, uncompressed, and relay both ways."""
        target = self.target
        assert target is not None
        request = httpclient.HTTPRequest(
            url=self.get_client_uri("ws", target.host, target.port, path or "/"),
            headers=self.proxy_request_headers(),
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
            log.warning("dashboard websocket of %s failed: %s", cluster_id, exc)
            self.close(1011, "the Ray dashboard refused the websocket")

    def _from_backend(self, message: str | bytes | None) -> None:
        self._record_activity()
        if message is None:
            self.close()
        else:
            self.write_message(message, binary=isinstance(message, bytes))

    def _ping_from_backend(self, data: bytes) -> None:
        self._record_activity()
        self.ping(data)


def route_specs(base_url: str, targets: DashboardTargets) -> list[tuple[str, type, dict]]:
    """Tornado routes: the proxy itself, and the redirect that adds the trailing slash."""
    from jupyter_server_proxy.handlers import AddSlashHandler

    prefix = url_path_join(base_url, PREFIX)
    cluster = r"([^/]+)"
    return [
        (f"{prefix}/{cluster}", AddSlashHandler, {}),
        (f"{prefix}/{cluster}(/.*)", DashboardProxyHandler, {"targets": targets}),
    ]
