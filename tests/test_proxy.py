"""The Ray dashboard proxy, with a real Jupyter server and a real Ray cluster on the testbed.

One cluster (one node, one CPU) serves every test of this module; the Jupyter server runs as a
subprocess with a token, so authentication is Jupyter's own.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote

import pytest
import requests
import websocket

from jupyter_slurm_ray.registry import Registry

from .conftest import ssh_transport
from .server_helpers import (
    Head,
    JupyterServer,
    dashboard_log,
    head_of,
    jupyter_server,
    start_cluster,
)

pytestmark = [pytest.mark.testbed, pytest.mark.ray]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("proxy")


@pytest.fixture(scope="module")
def cluster(root, testbed):
    cluster = start_cluster(root / "state", testbed.user, "proxytest")
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
def server(root, testbed, cluster) -> Iterator[JupyterServer]:
    with jupyter_server(root, testbed.user) as server:
        yield server


@pytest.fixture(scope="module")
def head(cluster) -> Head:
    return head_of(cluster)


def dashboard(cluster) -> str:
    return f"slurm-ray/dashboard/{cluster.id}/"


# -- authenticated access ---------------------------------------------------------------------
def test_dashboard_index_is_served_with_jupyter_auth(server, cluster):
    response = server.get(dashboard(cluster))
    assert response.status_code == 200, response.text[:500]
    assert "<title>Ray Dashboard</title>" in response.text


def test_dashboard_assets_are_served(server, cluster):
    index = server.get(dashboard(cluster)).text
    assets = [
        part.split('"')[0]
        for part in index.split('src="')[1:] + index.split('href="')[1:]
        if part.startswith("./static/")
    ]
    assert assets, index[:1000]
    for asset in assets:
        response = server.get(dashboard(cluster) + asset.removeprefix("./"))
        assert response.status_code == 200, asset
        assert len(response.content) > 100


def test_cluster_status_api_answers_through_the_proxy(server, cluster):
    response = server.get(dashboard(cluster) + "api/cluster_status")
    assert response.status_code == 200, response.text[:500]
    assert response.json()["result"] is True


def test_the_ray_token_is_needed_directly_but_not_through_the_proxy(server, cluster, head):
    assert requests.get(head.url + "api/cluster_status", timeout=10).status_code in (401, 403)
    response = requests.get(head.url + "api/cluster_status", headers=head.headers(), timeout=10)
    assert response.status_code == 200


def test_without_jupyter_auth_pages_redirect_to_login_and_apis_are_refused(server, cluster):
    page = server.get(dashboard(cluster), headers={})
    assert page.status_code == 302 and "/login" in page.headers["Location"]
    api = server.request("POST", dashboard(cluster) + "api/jobs/", headers={}, json={})
    assert api.status_code == 403
    wrong = server.get(dashboard(cluster), headers={"Authorization": "token not-the-token"})
    assert wrong.status_code == 302


def test_a_websocket_without_jupyter_auth_is_refused(server, cluster):
    url = server.url.replace("http", "ws", 1) + dashboard(cluster) + "api/jobs/x/logs/tail"
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(url, timeout=10)
    assert refused.value.status_code == 403


def test_unknown_cluster_is_404(server):
    assert server.get("slurm-ray/dashboard/nosuch-0000/").status_code == 404
    assert server.get("slurm-ray/dashboard/nosuch-0000/api/cluster_status").status_code == 404


def test_the_redirect_adds_the_trailing_slash(server, cluster):
    response = server.get(dashboard(cluster).rstrip("/") + "?x=1")
    assert response.status_code in (301, 302)
    assert response.headers["Location"].endswith(f"/slurm-ray/dashboard/{cluster.id}/?x=1")


def test_the_browser_never_sees_the_ray_token(server, cluster, head):
    for path in ("", "api/cluster_status", "api/authentication_mode", "nodes?view=summary"):
        response = server.get(dashboard(cluster) + path)
        assert head.token not in response.text
        assert head.token not in json.dumps(dict(response.headers))
        assert "ray-authentication-token" not in response.headers.get("Set-Cookie", "")


def test_the_jupyter_token_never_reaches_ray(server, cluster):
    marker = server.token
    cookies = {"username-127-0-0-1": marker, "_xsrf": marker}
    for path in ("", "api/cluster_status", "api/version", "no/such/page"):
        server.get(f"{dashboard(cluster)}{path}?token={marker}&a=1", cookies=cookies)
    server.request(
        "POST",
        dashboard(cluster) + "api/jobs/?token=" + marker,
        json={"entrypoint": "true"},
        headers={**server.headers(), "X-XSRFToken": marker},
        cookies=cookies,
    )
    time.sleep(1)  # let the dashboard flush its log
    logs = dashboard_log(cluster)
    assert "GET /api/version?a=1 " in logs, logs[-2000:]  # the requests are logged, query too
    assert marker not in logs


# -- path tricks reach nothing but the registered head ----------------------------------------
class _Canary(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Canary.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"canary")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def canary() -> Iterator[tuple[str, int, list[str]]]:
    """An HTTP server on loopback that must never be reached through the proxy."""
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Canary)
    _Canary.hits = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", httpd.server_address[1], _Canary.hits
    httpd.shutdown()
    httpd.server_close()


def test_path_tricks_reach_nothing_but_the_registered_head(server, cluster, canary):
    host, port, hits = canary
    where = f"{host}:{port}"
    base = dashboard(cluster)
    tricks = [
        f"{base}..%2f..%2f..%2fproxy/{port}/",
        f"{base}%2e%2e/%2e%2e/proxy/{port}/",
        f"{base}http://{where}/",
        f"{base}//{where}/",
        f"{base}%2f%2f{quote(where)}/",
        f"{base}@{where}/",
        f"{base}%40{where}/",
        f"{base}.%2e/{cluster.id}/..%2f..%2f",
        f"slurm-ray/dashboard/{where}/",
        f"slurm-ray/dashboard/{quote(where, safe='')}/",
        f"slurm-ray/dashboard/{cluster.id}%2f..%2f..%2fproxy%2f{port}/",
        f"slurm-ray/dashboard/{cluster.id}@{where}/",
        f"slurm-ray/dashboard/..%2f{cluster.id}/",
        f"{base}?url=http://{where}/",
    ]
    answers = {}
    for path in tricks:
        response = server.get(path)
        answers[path] = response.status_code
        assert "canary" not in response.text, path
    absolute = requests.get(
        server.url + base,
        headers={**server.headers(), "Host": where},
        allow_redirects=False,
        timeout=30,
    )
    assert "canary" not in absolute.text
    assert hits == [], (hits, answers)
    # ids that are not registered (or not ids at all) are 404; the rest reached the Ray head
    assert answers[f"slurm-ray/dashboard/{where}/"] == 404
    assert answers[f"slurm-ray/dashboard/{cluster.id}@{where}/"] == 404


def test_dotdot_segments_stay_inside_the_dashboard(server, cluster):
    response = server.get(dashboard(cluster) + "static/..%2f..%2f..%2fapi/cluster_status")
    assert response.status_code == 200 and response.json()["result"] is True


# -- websockets -------------------------------------------------------------------------------
def test_a_websocket_through_the_proxy_streams_a_job_log(server, cluster):
    submitted = server.request(
        "POST",
        dashboard(cluster) + "api/jobs/",
        json={"entrypoint": "echo hello-through-the-proxy; sleep 1; echo done"},
    )
    assert submitted.status_code == 200, submitted.text[:500]
    job_id = submitted.json()["submission_id"]
    url = server.url.replace("http", "ws", 1) + dashboard(cluster) + f"api/jobs/{job_id}/logs/tail"
    ws = websocket.create_connection(
        url,
        header=[f"Authorization: token {server.token}"],
        timeout=60,
        enable_multithread=True,
    )
    received = ""
    try:
        deadline = time.monotonic() + 60
        while "done" not in received and time.monotonic() < deadline:
            received += ws.recv()
    finally:
        ws.close()
    assert "hello-through-the-proxy" in received


def test_a_compressing_browser_websocket_still_works(server, cluster):
    """The browser offers permessage-deflate; the Ray side must not negotiate it."""
    submitted = server.request(
        "POST", dashboard(cluster) + "api/jobs/", json={"entrypoint": "echo compressed-ok"}
    )
    job_id = submitted.json()["submission_id"]
    url = server.url.replace("http", "ws", 1) + dashboard(cluster) + f"api/jobs/{job_id}/logs/tail"
    ws = websocket.create_connection(
        url,
        header=[
            f"Authorization: token {server.token}",
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits",
        ],
        timeout=60,
    )
    try:
        text = ""
        deadline = time.monotonic() + 60
        while "compressed-ok" not in text and time.monotonic() < deadline:
            text += ws.recv()
    finally:
        ws.close()
    assert "compressed-ok" in text


# -- SSH mode ---------------------------------------------------------------------------------
def test_an_ssh_target_is_proxied_through_an_ssh_forward(server, cluster, testbed):
    """A record made by a kernel on a laptop: the server reaches the head via the login node."""
    registry = Registry(server.state_dir)
    record = registry.load(cluster.id)
    record.id = f"viassh-{cluster.id.rsplit('-', 1)[1]}"
    record.target = ssh_transport(testbed).describe()
    registry.save(record)
    try:
        response = server.get(f"slurm-ray/dashboard/{record.id}/api/cluster_status")
        assert response.status_code == 200, response.text[:500]
        assert response.json()["result"] is True
        assert server.get(f"slurm-ray/dashboard/{record.id}/").status_code == 200
        forwarded = [
            line for line in server.log().splitlines() if f"dashboard of {record.id}" in line
        ]
        assert forwarded and "via 127.0.0.1:" in forwarded[-1], server.log()[-2000:]
    finally:
        registry.delete(record.id)


def test_cookie_authenticated_writes_must_come_from_jupyters_origin(server, cluster):
    """The proxy adds the Ray token: another site must not act with the user's Jupyter cookie."""
    browser = requests.Session()
    assert browser.get(f"{server.url}lab?token={server.token}", timeout=30).ok  # login cookie
    base = server.url + dashboard(cluster)
    assert browser.get(base + "api/cluster_status").status_code == 200
    for method, path in (("POST", "api/jobs/"), ("DELETE", "api/jobs/raysubmit_nosuch")):
        for origin in ({"Origin": "http://evil.example"}, {}):
            refused = browser.request(method, base + path, json={}, headers=origin)
            assert refused.status_code == 403 and "cross-site" in refused.text, (method, origin)
        own = browser.request(method, base + path, json={}, headers={"Origin": server.url[:-1]})
        assert "cross-site" not in own.text  # reached Ray (which has its own browser rules)
