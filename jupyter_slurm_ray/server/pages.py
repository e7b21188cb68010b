"""The sandboxed dashboard's plain HTTP requests, served on a short path.

Every request the dashboard's page makes (``api/cluster_status`` every few seconds, its assets,
its job list, log downloads and log streams) goes to ``/slurm-ray/dashboard/<id>/~<capability>/…``
(see ``capabilities.py``). Through jupyter-server-proxy's handler each of them paid for what this
route does not use: Jupyter's login machinery, a websocket-capable handler, Tornado's default
headers, an INFO log line. This handler is a plain Tornado ``RequestHandler`` that does only what
the route needs: Jupyter's ``Host`` check, the capability, the backend from the registry (cached
per record change), one request over the kept-alive connections, and the answer relayed as it
arrives (``relay.py``) with ``proxy.py``'s response rules (credentials stripped, Ray token
added, no ``Set-Cookie``, sandbox policy and ``nosniff`` on every response, CORS for the opaque
origin, storage shim, redirects kept under the route).

Websockets on the same URLs go to ``SandboxedDashboardHandler`` (jupyter-server-proxy's): see
:func:`page_rules`, which routes on the ``Upgrade`` header.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import httputil, web
from tornado.routing import PathMatches, Rule

from ..errors import DashboardUnavailable, NotFound
from .answers import HeadAnswer, HeadGone
from .backends import DashboardBackend, DashboardBackends
from .capabilities import (
    CapabilityRedacted,
    DashboardCapabilities,
    SandboxedDashboardHandler,
    preflight_answered,
)
from .proxy import (
    _DROPPED_REQUEST_HEADERS,
    PREFIX,
    ROUTE_HEADERS,
    DashboardError,
    backend_target,
    error_page,
    head_failed,
    unavailable,
)
from .relay import record_activity, relay

log = logging.getLogger(__name__)

_NOT_FORWARDED = frozenset(name.lower() for name in _DROPPED_REQUEST_HEADERS)


class _Websockets(PathMatches):
    """The route's websockets: they need jupyter-server-proxy's handler."""

    def match(self, request: httputil.HTTPServerRequest) -> dict[str, Any] | None:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        return super().match(request) if upgrade else None


def page_rules(
    prefix: str, backends: DashboardBackends, capabilities: DashboardCapabilities
) -> list[Rule]:
    """The capability route: websockets to ``SandboxedDashboardHandler``, the rest here."""
    pattern = f"{prefix}/([^/]+)/~([^/]*)(/.*)?"
    kwargs = {"backends": backends, "capabilities": capabilities}
    return [
        Rule(_Websockets(pattern), SandboxedDashboardHandler, kwargs),
        Rule(PathMatches(pattern), DashboardPageHandler, kwargs),
    ]


class DashboardPageHandler(CapabilityRedacted, web.RequestHandler):
    """Plain HTTP on ``/slurm-ray/dashboard/<id>/~<capability>/…``: authorized by the
    capability alone (Jupyter's login is neither needed nor used; its ``Host`` check is)."""

    backend: DashboardBackend | None = None
    answer: HeadAnswer | None = None  # the head's, while it is relayed

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
            self._set_route_headers()
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
        record_activity(self)
        try:
            self.answer = await self.backends.client.request(
                backend.host,
                backend.port,
                method,
                backend_target(self.path_args[2], self.request.query),
                self._request_headers(backend),
                body,
            )
            await relay(self, self.answer, self._under_route, self._route_headers())
        except HeadGone as exc:  # refused, reset, silent, refused answer: nothing sent yet
            raise head_failed(self.backends, backend.cluster_id, exc) from None

    def on_connection_close(self) -> None:
        if self.answer is not None:  # the browser left: so does the request to the head
            self.answer.abandon()

    def _request_headers(self, backend: DashboardBackend) -> list[tuple[str, str]]:
        headers = [
            (name, value)
            for name, value in self.request.headers.get_all()
            if name.lower() not in _NOT_FORWARDED
        ]
        headers.extend(backend.token_headers().items())
        return headers

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

    def _route_headers(self) -> dict[str, str]:
        """On every response of the route: the sandbox, and CORS for the sandboxed page."""
        headers = {**ROUTE_HEADERS, "Vary": "Origin"}
        if self.request.headers.get("Origin") == "null":
            headers["Access-Control-Allow-Origin"] = "null"
        return headers

    def _set_route_headers(self) -> None:
        for name, value in self._route_headers().items():
            self.set_header(name, value)

    def _answer_preflight(self) -> bool:
        if not preflight_answered(self):
            return False
        self._set_route_headers()
        self.finish()
        return True

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.message if isinstance(exc, DashboardError) else self._reason
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        if isinstance(exc, DashboardError) and exc.retry_after:
            self.set_header("Retry-After", str(exc.retry_after))
        self._set_route_headers()
        self.finish(error_page(status_code, message))
