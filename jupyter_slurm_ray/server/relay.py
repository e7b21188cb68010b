"""A head's answer relayed as the browser's response, the same way on both dashboard routes.

``pages.py`` (the sandboxed capability route) and ``proxy.py`` (the route behind Jupyter's
login) send their requests through ``keepalive.py`` and hand the :class:`HeadAnswer` here: its
status and end-to-end headers (never ``Set-Cookie``; a header Tornado would refuse dropped; a
redirect to one of the head's own paths kept under the route), then its body. An HTML page is
held whole, up to :data:`PAGE_BYTES`, to put the storage shim first in it; anything else is
streamed as it arrives, each piece written to the browser before the next is read, so a log of
many GB or a never-ending log stream costs the server no more memory than a small page. A
head that cuts a streamed body short cuts the browser's response too: the connection is
closed, so a truncated download never looks complete.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

from tornado import httputil, iostream, web

from .answers import HeadAnswer, HeadGone

log = logging.getLogger(__name__)

#: The largest page the proxy holds whole to rewrite it (the dashboard's index is ~2 KB).
PAGE_BYTES = 8 * 2**20

_NOT_RELAYED = frozenset({"set-cookie"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_NO_BODY = frozenset({204, 304})
_UNSAFE_VALUE = re.compile(r"[\x00-\x1f]")  # what Tornado refuses in a header value

#: Injected first into the dashboard's HTML: where storage or cookies are refused (an opaque
#: origin throws SecurityError on access), in-memory stand-ins, so the dashboard starts.
_STORAGE_SHIM = """<script>(function () {
  function memoryStorage() {
    var data = new Map();
    return {
      get length() { return data.size; },
      key: function (i) { var k = Array.from(data.keys())[i]; return k === undefined ? null : k; },
      getItem: function (k) { k = String(k); return data.has(k) ? data.get(k) : null; },
      setItem: function (k, v) { data.set(String(k), String(v)); },
      removeItem: function (k) { data.delete(String(k)); },
      clear: function () { data.clear(); }
    };
  }
  ['localStorage', 'sessionStorage'].forEach(function (name) {
    try { window[name]; } catch (e) {
      Object.defineProperty(window, name, { value: memoryStorage(), configurable: true });
    }
  });
  try { document.cookie; } catch (e) {
    Object.defineProperty(document, 'cookie', {
      get: function () { return ''; }, set: function () {}, configurable: true
    });
  }
})();</script>"""
_HEAD_TAG = re.compile(rb"<head(\s[^>]*)?>", re.IGNORECASE)


async def relay(
    handler: web.RequestHandler,
    answer: HeadAnswer,
    under_route: Callable[[str], str],
    route_headers: Mapping[str, str] | None = None,
) -> None:
    """Write ``answer`` as ``handler``'s response, with ``route_headers`` over the head's.
    BadAnswer (before anything was written) when a page is larger than PAGE_BYTES; after
    the first byte, failures close the browser's connection instead (it has the status)."""
    handler.set_status(answer.status, answer.reason or None)
    headers = httputil.HTTPHeaders()
    for name, value in answer.headers:
        lower = name.lower()
        if lower in _NOT_RELAYED or _UNSAFE_VALUE.search(value) or _UNSAFE_VALUE.search(name):
            continue
        if lower == "location" and answer.status in _REDIRECTS:
            value = under_route(value)
        headers.add(name, value)
    for name, value in (route_headers or {}).items():
        headers[name] = value
    if handler.request.method == "HEAD" or answer.status in _NO_BODY:
        handler._headers = headers  # the head's, none of Tornado's defaults
        answer.abandon()  # complete already: nothing to read
        return
    if is_page(headers):
        body = await answer.read(PAGE_BYTES)
        headers.pop("Content-Length", None)  # the shim changes it (Tornado sets it)
        handler._headers = headers
        handler.write(with_storage_shim(headers, body))
        return
    handler._headers = headers
    first = answer.ready()
    if answer.complete:  # a small answer: one write, its length set by Tornado
        handler.write(first)
        return
    await _stream(handler, answer, first)


async def _stream(handler: web.RequestHandler, answer: HeadAnswer, chunk: bytes) -> None:
    """Write the body as it arrives, each piece sent before the next is read."""
    try:
        while True:
            if chunk:
                handler.write(chunk)
            # RequestHandler's own: jupyter-server-proxy's handler wraps flush and drops the
            # future that says the piece was sent (the browser's pace).
            await web.RequestHandler.flush(handler)
            record_activity(handler)
            chunk = await answer.next()
            if not chunk:
                return
    except HeadGone as exc:  # after the status was sent: the browser must see it cut
        if not answer.abandoned:  # (abandoned: the browser left, see on_connection_close)
            log.warning("a dashboard answer was cut short: %s", exc)
        handler.request.connection.close()  # type: ignore[union-attr]
    except iostream.StreamClosedError:  # the browser went away
        answer.abandon()


def is_page(headers: httputil.HTTPHeaders) -> bool:
    return headers.get("Content-Type", "").startswith("text/html")


def with_storage_shim(headers: httputil.HTTPHeaders, body: bytes) -> bytes:
    """An HTML page's body with the storage stand-ins first in it; other bodies unchanged."""
    if not is_page(headers):
        return body
    if headers.get("Content-Encoding", "identity") != "identity":
        log.warning("a compressed dashboard page got no storage shim")
        return body
    match = _HEAD_TAG.search(body)
    at = match.end() if match else 0
    return body[:at] + _STORAGE_SHIM.encode() + body[at:]


def record_activity(handler: web.RequestHandler) -> None:
    """Proxied traffic counts as activity for Jupyter's idle shutdown (as in
    jupyter-server-proxy)."""
    handler.settings["api_last_activity"] = datetime.now(timezone.utc)
