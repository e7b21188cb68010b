"""Sandboxed dashboard pages: per-cluster capability URLs that stand for Jupyter's login.

``/slurm-ray/dashboard/<id>/~<capability>/…`` serves the dashboard to an opaque origin (see
``proxy.py``): the capability, an unguessable path segment minted for a logged-in user by
``POST /slurm-ray/dashboard-links/<id>`` and valid in this server process only, is the
request's whole authorization. Nothing on this route can use the user's Jupyter session.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import httputil, web

from ..errors import SlurmRayError
from .backends import DashboardBackends
from .proxy import PREFIX, DashboardError, _DashboardProxy

LINKS_PREFIX = "slurm-ray/dashboard-links"

log = logging.getLogger(__name__)


class DashboardCapabilities:
    """Unguessable URL segments standing for one cluster's dashboard, in this process only.

    One capability per cluster, reused while it is used (the browser caches the dashboard's
    assets under it); one unused for ``idle_timeout`` seconds is forgotten.
    """

    def __init__(self, idle_timeout: float = 12 * 3600) -> None:
        self.idle_timeout = idle_timeout
        self._cluster_of: dict[str, str] = {}
        self._of_cluster: dict[str, str] = {}
        self._used: dict[str, float] = {}

    def mint(self, cluster_id: str) -> str:
        self._expire()
        capability = self._of_cluster.get(cluster_id)
        if capability is None:
            capability = secrets.token_urlsafe(32)
            self._cluster_of[capability] = cluster_id
            self._of_cluster[cluster_id] = capability
        self._used[capability] = time.monotonic()
        return capability

    def cluster_of(self, capability: str) -> str | None:
        """The cluster a capability stands for (None: unknown or expired)."""
        self._expire()
        cluster_id = self._cluster_of.get(capability)
        if cluster_id is not None:
            self._used[capability] = time.monotonic()
        return cluster_id

    def revoke(self, cluster_id: str) -> None:
        capability = self._of_cluster.pop(cluster_id, None)
        if capability is not None:
            self._cluster_of.pop(capability, None)
            self._used.pop(capability, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for capability, used in list(self._used.items()):
            if now - used > self.idle_timeout:
                self.revoke(self._cluster_of[capability])


class CapabilityRedacted:
    """Log lines of the capability route without its capability (the route's whole
    authorization): errors only (the page polls every few seconds), with ``~…`` in its place.
    Tornado's own lines (the access log, an HTTPError's warning) name the whole URL."""

    # From the handler it is mixed into (annotations only: nothing here shadows them).
    path_args: list[Any]
    request: httputil.HTTPServerRequest
    get_status: Callable[[], int]

    def _log(self) -> None:
        if self.get_status() >= 400:
            log.warning("%d %s %s", self.get_status(), self.request.method, self._redacted_path())

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, web.HTTPError):  # answered with its page; _log tells it
            return
        log.error("uncaught exception on %s", self._redacted_path(), exc_info=(typ, value, tb))

    def _redacted_path(self) -> str:
        cluster_id, _, path = [*(self.path_args or []), "?", "", ""][:3]
        return f"/{PREFIX}/{cluster_id}/~…{path or ''}"


def preflight_answered(handler: web.RequestHandler) -> bool:
    """Whether the request is a CORS preflight from the sandboxed page (its origin is opaque):
    if so, its 204 status and headers are set (the caller adds its own and finishes)."""
    request = handler.request.headers
    if "Access-Control-Request-Method" not in request:
        return False
    handler.set_status(204)
    handler.set_header("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, PATCH, DELETE")
    handler.set_header("Access-Control-Max-Age", "600")
    requested = request.get("Access-Control-Request-Headers")
    if requested:
        handler.set_header("Access-Control-Allow-Headers", requested)
    return True


class SandboxedDashboardHandler(CapabilityRedacted, _DashboardProxy):
    """``/slurm-ray/dashboard/<id>/~<capability>/…``: authorized by the capability alone.

    Jupyter's identity is neither needed nor used; the browser reaches this URL from the
    dashboard's opaque origin, so its requests are cross-origin: CORS lets that origin (and
    only that, ``null``) read the answers, without credentials.
    """

    async def _authorize(self) -> bool:
        # Jupyter's checks of the Host header (DNS rebinding) still apply; its login does not.
        await JupyterHandler.prepare(self)
        capability = self.path_args[1]
        if self.capabilities.cluster_of(capability) != self.cluster_id:
            raise DashboardError(
                404,
                "This dashboard link is not valid (any more): the Jupyter server restarted, or "
                "the link was not used for a long time. Open the dashboard again from "
                "JupyterLab's Slurm Ray sidebar.",
            )
        if self.path_args[2] is None:  # the dashboard's relative links need the slash
            query = f"?{self.request.query}" if self.request.query else ""
            self.redirect(f"{self.request.path}/{query}", permanent=False)
            return False
        return True

    def _root(self) -> str:
        return url_path_join(self.base_url, PREFIX, self.cluster_id, f"~{self.path_args[1]}")

    def check_origin(self, origin: str | None = None) -> bool:
        """Websockets: the capability in the URL authorizes them (checked in ``prepare``)."""
        return True

    def _answer_preflight(self) -> bool:
        if not preflight_answered(self):
            return False
        self.finish()
        return True

    def response_headers(self, headers: httputil.HTTPHeaders) -> dict[str, str]:
        extra = super().response_headers(headers)
        if self.request.headers.get("Origin") == "null":
            extra["Access-Control-Allow-Origin"] = "null"
        extra["Vary"] = "Origin"
        return extra

    # Jupyter's ``allow_unauthenticated_access = False`` must not refuse them: the capability
    # is their authentication. (New functions: marking the base class's would open it too.)
    @allow_unauthenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        await super().get(*args, **kwargs)

    @allow_unauthenticated
    async def _forward_without_login(self, *args: Any) -> None:
        await self._forward()

    post = put = delete = patch = head = options = _forward_without_login


class DashboardLinkHandler(APIHandler):
    """``POST /slurm-ray/dashboard-links/<id>``: the sandboxed dashboard URL of a cluster.

    For a logged-in user (Jupyter's API rules: token, or cookie plus XSRF); answers
    ``{"url": "<base>slurm-ray/dashboard/<id>/~<capability>/"}``.
    """

    def initialize(self, backends: DashboardBackends, capabilities: DashboardCapabilities) -> None:
        self.backends = backends
        self.capabilities = capabilities

    @web.authenticated
    async def post(self, cluster_id: str) -> None:
        try:
            record = self.backends.registry.load(cluster_id)
        except SlurmRayError:
            record = None
        if record is None:
            raise web.HTTPError(404, f"no Ray cluster {cluster_id!r}")
        capability = self.capabilities.mint(cluster_id)
        url = url_path_join(self.base_url, PREFIX, cluster_id, f"~{capability}") + "/"
        self.set_status(201)
        self.set_header("Cache-Control", "no-store")
        self.finish({"url": url})
