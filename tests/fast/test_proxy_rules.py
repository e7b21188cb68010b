"""The dashboard proxy's HTTP rules, through both of its routes, against a scripted head.

The server extension is loaded in-process (``jp_fetch``'s server) with short timeouts; a
cluster record names a scripted head on loopback (tests/helpers/scripted_head.py) as its
dashboard, so each test makes the head misbehave in one precise way and checks what the
browser gets. Both routes are checked: ``token`` (``slurm-ray/dashboard/<id>/…`` with
Jupyter's token) and ``page`` (the sandboxed capability URL, no login).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError, HTTPResponse

from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.server import keepalive, relay
from jupyter_slurm_ray.server.backends import DashboardBackends

from ..helpers.scripted_head import ScriptedHead, answer, chunk, sends, unanswered_listener

ROUTES = ("token", "page")
TOKEN = "ray-token-of-the-scripted-head"


@pytest.fixture
def jp_server_config(jp_server_config, monkeypatch):
    """Short timeouts and a small page limit, before the extension makes its client."""
    limits = keepalive.Limits(connect_seconds=0.5, answer_seconds=1.5)
    monkeypatch.setattr(keepalive, "DEFAULT_LIMITS", limits)
    monkeypatch.setattr(relay, "PAGE_BYTES", 64 * 1024)
    return jp_server_config


@pytest.fixture
async def head() -> AsyncIterator[ScriptedHead]:
    scripted = await ScriptedHead({}).start()
    yield scripted
    await scripted.stop()


@dataclass
class Dashboard:
    """A registered cluster whose dashboard is ``port``; fetch its paths by either route."""

    client: Any  # pytest-jupyter's http_server_client
    base_url: str
    auth: dict[str, str]
    cluster_id: str
    link: str  # the capability route's root (path, ends with "/")

    def url(self, route: str, path: str) -> str:
        if route == "token":
            return f"{self.base_url}slurm-ray/dashboard/{self.cluster_id}/{path}"
        return self.link + path

    async def fetch(self, route: str, path: str, **kwargs: Any) -> HTTPResponse:
        headers = {**(self.auth if route == "token" else {}), **kwargs.pop("headers", {})}
        kwargs.setdefault("request_timeout", 20)
        return await self.client.fetch(
            self.url(route, path), headers=headers, raise_error=False, **kwargs
        )


@pytest.fixture
async def register(jp_fetch, server_manager, http_server_client, jp_base_url, jp_auth_header, site):
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    made = 0

    async def register_dashboard(port: int, tmp: Path) -> Dashboard:
        nonlocal made
        made += 1
        cluster_id = f"scripted{made}-0000"
        job_dir = tmp / cluster_id
        job_dir.mkdir(mode=0o700)
        connection = {
            "head_ip": "127.0.0.1",
            "client_port": 1,
            "dashboard_port": port,
            "gcs_address": "127.0.0.1:1",
            "ray_version": "0",
            "python_version": "0",
            "node_count": 1,
            # the bootstrap's word that these listeners are the job's own Ray's
            "verified": {"uid": os.getuid(), "listeners": {"client": 1, "dashboard": port}},
        }
        (job_dir / "connection.json").write_text(json.dumps(connection))
        record = ClusterRecord(
            id=cluster_id,
            name=f"scripted{made}",
            job_id=None,
            state="READY",
            target="fake",
            job_dir=str(job_dir),
        )
        registry.save(record)
        registry.store_token(cluster_id, TOKEN)
        minted = await jp_fetch("slurm-ray", "dashboard-links", cluster_id, method="POST", body=b"")
        link = json.loads(minted.body)["url"]
        return Dashboard(http_server_client, jp_base_url, jp_auth_header, cluster_id, link)

    return register_dashboard


@pytest.fixture
async def dashboard(register, head, tmp_path) -> Dashboard:
    return await register(head.port, tmp_path)


def backends_of(app: Any) -> DashboardBackends:
    """The extension's DashboardBackends, found among its routes' arguments."""
    routers = [app.default_router, app.wildcard_router]
    while routers:
        for rule in routers.pop().rules:
            found = (rule.target_kwargs or {}).get("backends")
            if found is not None:
                return found
            if hasattr(rule.target, "rules"):
                routers.append(rule.target)
    raise AssertionError("no DashboardBackends among the routes")


def sandboxed(response: HTTPResponse) -> None:
    headers = response.headers
    assert headers["Content-Security-Policy"].startswith("sandbox allow-scripts"), headers
    assert "allow-same-origin" not in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff", headers


async def eventually(check, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    assert check()


# -- the sandbox on every response ------------------------------------------------------------
CONTENT = {
    "/html": ("text/html; charset=utf-8", b"<html><head></head><body>hi</body></html>"),
    "/json": ("application/json", b'{"result": true}'),
    "/png": ("image/png", b"\x89PNG\r\n\x1a\n" + bytes(64)),
    "/svg": ("image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg"><script/></svg>'),
    "/octet": ("application/octet-stream", bytes(range(256))),
    "/missing": ("text/plain", b"no such page"),
}


@pytest.mark.parametrize("route", ROUTES)
async def test_every_answer_carries_the_sandbox_and_nosniff_whatever_its_type(
    dashboard, head, route
):
    for path, (content_type, body) in CONTENT.items():
        status = "404 Not Found" if path == "/missing" else "200 OK"
        head.scripts[path] = sends(answer(status, [("Content-Type", content_type)], body))
    head.scripts["/moved"] = sends(answer("302 Found", [("Location", "/html")]))
    for path, (content_type, body) in CONTENT.items():
        response = await dashboard.fetch(route, path.lstrip("/"))
        assert response.code == (404 if path == "/missing" else 200), path
        assert response.headers["Content-Type"] == content_type
        if path != "/html":  # a page gets the storage shim
            assert response.body == body, path
        sandboxed(response)
    moved = await dashboard.fetch(route, "moved", follow_redirects=False)
    assert moved.code == 302
    sandboxed(moved)


@pytest.mark.parametrize("route", ROUTES)
async def test_the_proxys_own_error_pages_carry_the_sandbox_too(
    dashboard, register, head, tmp_path, route
):
    head.scripts["/silent"] = lambda reader, writer: asyncio.sleep(10)
    head.scripts["/huge"] = sends(answer("200 OK", [("X-Huge", "h" * 70_000)]))
    page = answer("200 OK", [("Content-Type", "text/html")], b"<html>" + b"x" * 70_000)
    head.scripts["/big-page"] = sends(page)
    silent = await dashboard.fetch(route, "silent")
    assert (
        silent.code == 504
        and b"accepted the request but sent no answer within 1.5 s" in silent.body
    )
    huge = await dashboard.fetch(route, "huge")
    assert huge.code == 502 and b"its headers are larger than 64 KB" in huge.body
    big = await dashboard.fetch(route, "big-page")
    assert big.code == 502 and b"is larger than 64 KB" in big.body
    for response in (silent, huge, big):
        assert b"refuses" in response.body or response.code == 504
        assert response.headers["Content-Type"].startswith("text/html")
        sandboxed(response)
    with unanswered_listener() as port:  # no connection within the connect timeout
        hung = await register(port, tmp_path)
        unreachable = await hung.fetch(route, "anything")
    assert unreachable.code == 503 and b"its dashboard does not answer" in unreachable.body
    sandboxed(unreachable)


async def test_the_page_routes_redirects_and_preflights_carry_the_sandbox(dashboard):
    bare = await dashboard.client.fetch(
        dashboard.link.rstrip("/"), raise_error=False, follow_redirects=False
    )
    assert bare.code == 302
    sandboxed(bare)
    preflight = await dashboard.fetch(
        "page",
        "api/jobs/",
        method="OPTIONS",
        headers={"Origin": "null", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.code == 204
    sandboxed(preflight)


# -- desynchronised and interim answers -------------------------------------------------------
RIGHT = answer("200 OK", [("Content-Type", "text/plain")], b"right answer")
WRONG = answer("200 OK", [("Content-Type", "text/plain")], b"WRONG ANSWER")


@pytest.mark.parametrize("route", ROUTES)
async def test_a_desynchronised_head_never_answers_the_next_request(dashboard, head, route):
    head.scripts["/first"] = sends(RIGHT, WRONG)  # two answers to one request
    head.scripts["/next"] = sends(RIGHT)
    first = await dashboard.fetch(route, "first")
    assert (first.code, first.body) == (200, b"right answer")
    following = await dashboard.fetch(route, "next")
    assert (following.code, following.body) == (200, b"right answer")
    assert [r.connection for r in head.requests] == [1, 2]  # a fresh connection
    await eventually(lambda: 1 in head.closed)


@pytest.mark.parametrize("route", ROUTES)
async def test_interim_answers_are_skipped_and_the_final_one_relayed(dashboard, head, route):
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </static/app.js>; rel=preload\r\n\r\n"
    )
    head.scripts["/api/jobs/"] = sends(interim, answer("201 Created", [("X-Job", "j1")], b"{}"))
    response = await dashboard.fetch(route, "api/jobs/", method="POST", body=b'{"a": 1}')
    assert (response.code, response.body, response.headers["X-Job"]) == (201, b"{}", "j1")
    assert "Link" not in response.headers
    assert head.requests[-1].body == b'{"a": 1}'


# -- hop-by-hop headers, both ways ------------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES)
async def test_hop_by_hop_headers_are_dropped_both_ways(dashboard, head, route):
    answer_headers = [
        ("Connection", "keep-alive, X-Internal"),
        ("X-Internal", "for the proxy only"),
        ("Keep-Alive", "timeout=75"),
        ("Proxy-Authenticate", "Basic realm=head"),
        ("Trailer", "X-Checksum"),
        ("X-Kept", "end to end"),
    ]
    head.scripts["/h"] = sends(answer("200 OK", answer_headers, b"ok"))
    request_headers = {
        "Connection": "X-Browser-Hop",
        "X-Browser-Hop": "for the proxy only",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Proxy-Authorization": "Basic eA==",
        "X-Sent": "end to end",
    }
    response = await dashboard.fetch(route, "h", headers=request_headers)
    assert response.code == 200 and response.headers["X-Kept"] == "end to end"
    for name in ("X-Internal", "Keep-Alive", "Proxy-Authenticate", "Trailer"):
        assert name not in response.headers, name
    seen = head.requests[-1].headers
    assert seen["X-Sent"] == "end to end"
    assert seen["X-Ray-Authorization"] == f"Bearer {TOKEN}"
    for name in ("X-Browser-Hop", "Keep-Alive", "TE", "Proxy-Authorization", "Connection"):
        assert name not in seen, name


# -- streaming --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("route", "accept"),
    [
        ("token", "*/*"),
        ("page", "*/*"),
        ("token", "text/event-stream"),
        ("page", "text/event-stream"),
    ],
)
async def test_a_body_reaches_the_browser_as_it_arrives(dashboard, head, route, accept):
    release = asyncio.Event()

    async def stepwise(reader, writer) -> None:
        headers = [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")]
        writer.write(answer("200 OK", headers) + chunk(b"first line\n"))
        await writer.drain()
        await release.wait()
        writer.write(chunk(b"second line\n") + chunk(b""))

    head.scripts["/api/v0/logs/stream"] = stepwise
    received: list[bytes] = []
    fetching = asyncio.ensure_future(
        dashboard.fetch(
            route,
            "api/v0/logs/stream",
            headers={"Accept": accept},
            streaming_callback=received.append,
        )
    )
    await eventually(lambda: b"first line\n" in b"".join(received))
    assert not fetching.done()  # the head has not finished: the proxy did not wait for it
    release.set()
    response = await fetching
    assert response.code == 200 and b"".join(received) == b"first line\nsecond line\n"
    sandboxed(response)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_body_the_head_cuts_short_is_cut_short_for_the_browser(
    dashboard, head, route, framing
):
    async def cut(reader, writer) -> None:
        framed = [("Content-Length", "100000")] if framing == "length" else []
        framed.append(("Transfer-Encoding", "chunked") if framing == "chunked" else ("X", "y"))
        body = b"x" * 1000 if framing == "length" else chunk(b"x" * 1000)
        writer.write(answer("200 OK", [("Content-Type", "text/plain"), *framed]) + body)
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    head.scripts["/download"] = cut
    with pytest.raises((HTTPClientError, OSError)):  # never a complete answer
        response = await dashboard.fetch(route, "download")
        response.rethrow()


@pytest.mark.parametrize("route", ROUTES)
async def test_a_browser_that_leaves_a_quiet_stream_ends_it_at_the_head(dashboard, head, route):
    async def quiet(reader, writer) -> None:
        headers = [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")]
        writer.write(answer("200 OK", headers) + chunk(b"started\n"))
        await writer.drain()
        await asyncio.wait_for(reader.read(1), 30)  # nothing more, until the proxy leaves

    head.scripts["/api/v0/logs/stream"] = quiet
    received: list[bytes] = []
    with pytest.raises(HTTPClientError, match="Timeout"):  # the browser gives up and leaves
        await dashboard.fetch(
            route, "api/v0/logs/stream", streaming_callback=received.append, request_timeout=1
        )
    assert b"started\n" in b"".join(received)
    await eventually(lambda: head.closed == [1])  # the proxy closed its side


# -- the pool ---------------------------------------------------------------------------------
async def test_forgetting_a_backend_empties_the_pool(dashboard, head, jp_serverapp):
    head.scripts["/a"] = sends(RIGHT)
    for route in ROUTES:
        assert (await dashboard.fetch(route, "a")).code == 200
    backends = backends_of(jp_serverapp.web_app)
    assert backends.client.idle("127.0.0.1", head.port) >= 1
    backends.forget(dashboard.cluster_id)
    assert backends.client.idle("127.0.0.1", head.port) == 0
    await eventually(lambda: head.closed == [1])
    assert (await dashboard.fetch("page", "a")).body == b"right answer"  # afresh
