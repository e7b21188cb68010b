"""The token route: ``/slurm-ray/dashboard/<id>/…`` behind Jupyter's own login, for scripts (a
browser's navigation is sent on to the sandboxed page route of ``capabilities.py``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from jupyter_server.utils import origin_matches_pat, url_path_join
from jupyter_server_proxy.handlers import ProxyHandler
from tornado import web

from .proxy import _DROPPED_QUERY_KEYS, PREFIX, _DashboardProxy

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_NAVIGATIONS = frozenset({"document", "iframe", "frame", "embed", "object"})


class DashboardProxyHandler(_DashboardProxy):
    """``/slurm-ray/dashboard/<id>/…`` behind Jupyter's login (token or cookie).

    Scripts use it with Jupyter's token. A browser's navigation to it is redirected to the
    capability URL of the same page, so the dashboard's pages run sandboxed.
    """

    async def _authorize(self) -> bool:
        await ProxyHandler.prepare(self)  # Jupyter's login: 302 / 403 without it
        if self._finished:  # redirected to the login page
            return False
        self._refuse_cross_site_writes()
        return True

    def _root(self) -> str:
        return url_path_join(self.base_url, PREFIX, self.cluster_id)

    def _refuse_cross_site_writes(self) -> None:
        """CSRF: the proxy adds the Ray token, so a cookie's write must come from Jupyter.

        What counts is how Jupyter authenticated the request: a token (``Authorization:
        token …`` or ``?token=``) is explicit, a script's; the login cookie is ambient, sent by
        the browser whatever page asks. A cookie-authenticated write must carry ``Origin`` (or
        at least ``Referer``) naming this server (or an origin Jupyter's ``allow_origin`` /
        ``allow_origin_pat`` trusts explicitly). Jupyter's XSRF token is not required: the
        dashboard's own page does not send it.
        """
        if self.request.method in _SAFE_METHODS or self.token_authenticated:
            return
        headers = self.request.headers
        source = headers.get("Origin") or headers.get("Referer")
        if not self._is_own_origin(source):
            raise web.HTTPError(403, f"cross-site {self.request.method} refused (from {source})")

    def _is_own_origin(self, source: str | None) -> bool:
        parts = urlsplit(source or "")
        if not parts.scheme or not parts.netloc:  # missing, "null" (an opaque origin), junk
            return False
        if parts.netloc == self.request.headers.get("Host"):
            return True
        origin = f"{parts.scheme}://{parts.netloc}"
        if self.allow_origin and self.allow_origin != "*":
            return origin == self.allow_origin
        return bool(self.allow_origin_pat and origin_matches_pat(self.allow_origin_pat, origin))

    async def http_get(self, *args: Any) -> None:
        if self._is_navigation():
            self.redirect(self._capability_url(), permanent=False)
            return
        await self._forward()

    def _is_navigation(self) -> bool:
        """A browser loading a page (tab, IFrame), as opposed to a script's request."""
        dest = self.request.headers.get("Sec-Fetch-Dest")
        if dest is not None:
            return dest in _NAVIGATIONS
        accept = self.request.headers.get("Accept", "")
        return accept.split(",", 1)[0].strip().startswith("text/html")

    def _capability_url(self) -> str:
        capability = self.capabilities.mint(self.cluster_id)
        url = url_path_join(self._root(), f"~{capability}", quote(self.proxied_path))
        if self.proxied_path.endswith("/") and not url.endswith("/"):
            url += "/"
        query = [
            (key, value)
            for key, value in parse_qsl(self.request.query, keep_blank_values=True)
            if key not in _DROPPED_QUERY_KEYS
        ]
        return f"{url}?{urlencode(query)}" if query else url
