"""The sandboxed dashboard's plain HTTP requests, served on a short path.

Every request the dashboard's page makes (``api/cluster_status`` every few seconds, its assets,
its job list) goes to ``/slurm-ray/dashboard/<id>/~<capability>/…`` (see ``capabilities.py``).
Through jupyter-server-proxy's handler each of them paid for what this route does not use:
Jupyter's login machinery, a websocket-capable handler, Tornado's default headers, an INFO log
line. This handler is a plain Tornado ``RequestHandler`` that does only what the route needs:
Jupyter's ``Host`` check, the capability, the backend from the registry (cached per record
change), one kept-alive request to the head, and the same response rules as ``proxy.py``
(credentials stripped, Ray token added, no ``Set-Cookie``, sandbox policy, CORS for the opaque
origin, storage shim, redirects kept under the route).

Websockets and event streams on the same URLs still go to ``SandboxedDashboardHandler``: see
:func:`page_rules`, which routes on the ``Upgrade`` and ``Accept`` headers.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import httputil, web
from tornado.routing import PathMatches, Rule

from ..errors import DashboardUnavailable, NotFound
from .backends import DashboardBackend, DashboardBackends
from .capabilities import (
    CapabilityRedacted,
    DashboardCapabilities,
    SandboxedDashboardHandler,
    preflight_answered,
)
from .keepalive import HeadGone, Reply
from .proxy import (
    _DROPPED_REQUEST_HEADERS,
    _HOP_BY_HOP_REQUEST,
    PREFIX,
    SANDBOX_POLICY,
    DashboardError,
    backend_failed,
    backend_target,
    error_page,
    unavailable,
    with_storage_shim,
)

log = logging.getLogger(__name__)

_NOT_RELAYED = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "set-cookie", "date"}
)
_NOT_FORWARDED = frozenset(
    name.lower() for name in (*_DROPPED_REQUEST_HEADERS, *_HOP_BY_HOP_REQUEST)
)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Streams(PathMatches):
    """The route's websockets and event streams: they need the full proxy handler."""

    def match(self, request: httputil.HTTPServerRequest) -> dict[str, Any] | None:
        headers = request.headers
        streaming = (
            headers.get("Upgrade", "").lower() == "websocket"
            or headers.get("Accept") == "text/event-stream"
        )
        return super().match(request) if streaming else None


def page_rules(
    prefix: str, backends: DashboardBackends, capabilities: DashboardCapabilities
) -> list[Rule]:
    """The capability route: streams to ``SandboxedDashboardHandler``, the rest here."""
    pattern = f"{prefix}/([^/]+)/~([^/]*)(/.*)?"
    kwargs = {"backends": backends, "capabilities": capabilities}
    return [
        Rule(_Streams(pattern), SandboxedDashboardHandler, kwargs),
        Rule(PathMatches(pattern), DashboardPageHandler, kwargs),
    ]


class DashboardPageHandler(CapabilityRedacted, web.RequestHandler):
    """Plain HTTP on ``/slurm-ray/dashboard/<id>/~<capability>/…``: authorized by the
    capability alone (Jupyter's login is neither needed nor used; its ``Host`` check is)."""

    backend: DashboardBackend | None = None

    def initialize(self, backends: DashboardBackends, capabilities: DashboardCapabilities) -> None:
        self.backends = backends
        self.capabilities = capabilities

    @property
    def log(self) -> logging.Logger:  # what JupyterHandler.check_host logs to
        return log

    def set_default_headers(self) -> None:
        self.clear_header("Server")
        self.clear_header("Content-Type")

    def check_xsrf_cookie(self) -> None:
        """No cookie authenticates this route (the capability does): nothing to forge."""

    async def prepare(self) -> None:
        if not JupyterHandler.check_host(self):  # type: ignore[arg-type]
            raise web.HTTPError(403)
        cluster_id, capability, path = self.path_args
        if self.capabilities.cluster_of(capability) != cluster_id:
            raise DashboardError(
                404,
                "This dashboard link is not valid (any more): the Jupyter server restarted, or "
                "the link was not used for a long time. Open the dashboard again from "
                "JupyterLab's Slurm Ray sidebar.",
            )
        if path is None:  # the dashboard's relative links need the slash
            query = f"?{self.request.query}" if self.request.query else ""
            self.redirect(f"{self.request.path}/{query}", permanent=False)
            return
        if self.request.method == "OPTIONS" and self._answer_preflight():
            return
        try:
            self.backend = await self.backends.resolve(cluster_id)
        except NotFound:
            raise DashboardError(404, f"There is no Ray cluster `{cluster_id}`.") from None
        except DashboardUnavailable as exc:
            raise unavailable(self.backends, cluster_id, exc) from None

    @allow_unauthenticated
    async def get(self, *args: Any) -> None:
        await self._forward()

    @allow_unauthenticated
    async def _forward_any(self, *args: Any) -> None:
        await self._forward()

    post = put = delete = patch = head = options = _forward_any

    async def _forward(self) -> None:
        backend = self.backend
        assert backend is not None
        method = self.request.method or "GET"
        body = self.request.body or (b"" if method in ("POST", "PUT") else None)
        self._record_activity()
        try:
            reply = await self.backends.client.send(
                backend.host,
                backend.port,
                method,
                backend_target(self.path_args[2], self.request.query),
                self._request_headers(backend),
                body,
            )
        except HeadGone as exc:  # refused, reset, timed out
            raise backend_failed(self.backends, backend.cluster_id, exc) from None
        self._relay(reply)

    def _request_headers(self, backend: DashboardBackend) -> list[tuple[str, str]]:
        headers = [
            (name, value)
            for name, value in self.request.headers.get_all()
            if name.lower() not in _NOT_FORWARDED
        ]
        headers.extend(backend.token_headers().items())
        return headers

    def _relay(self, reply: Reply) -> None:
        self.set_status(reply.status, reply.reason or None)
        content_type = ""
        for name, value in reply.headers:
            lower = name.lower()
            if lower in _NOT_RELAYED:
                continue
            if lower == "location" and reply.status in _REDIRECTS:
                value = self._under_route(value)
            elif lower == "content-type":
                content_type = value
            self.add_header(name, value)
        self._set_route_headers(content_type)
        body = with_storage_shim(self._headers, reply.body)  # HTML pages only
        if body:
            self.write(body)

    def compute_etag(self) -> None:
        """The head's own ETag (and its answer to If-None-Match) is relayed; none added."""
        return None

    def _under_route(self, location: str) -> str:
        """A redirect of the head to one of its own paths, kept under this route."""
        parts = urlsplit(location)
        if parts.scheme or parts.netloc or not location.startswith("/"):
            return location
        return url_path_join(self._root(), location)

    def _root(self) -> str:
        cluster_id, capability, _ = self.path_args
        base_url = self.settings.get("base_url", "/")
        return url_path_join(base_url, PREFIX, cluster_id, f"~{capability}")

    def _set_route_headers(self, content_type: str) -> None:
        self.set_header("Referrer-Policy", "no-referrer")
        if content_type.startswith("text/html"):
            self.set_header("Content-Security-Policy", SANDBOX_POLICY)
        if self.request.headers.get("Origin") == "null":
            self.set_header("Access-Control-Allow-Origin", "null")
        self.set_header("Vary", "Origin")

    def _answer_preflight(self) -> bool:
        if not preflight_answered(self):
            return False
        self._set_route_headers("")
        self.finish()
        return True

    def _record_activity(self) -> None:
        """Proxied traffic counts as activity for Jupyter's idle shutdown (as in
        jupyter-server-proxy)."""
        self.settings["api_last_activity"] = datetime.now(timezone.utc)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.message if isinstance(exc, DashboardError) else self._reason
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        if isinstance(exc, DashboardError) and exc.retry_after:
            self.set_header("Retry-After", str(exc.retry_after))
        self._set_route_headers("text/html")
        self.finish(error_page(status_code, message))
