"""The Ray dashboard proxy, with a real Jupyter server and a real Ray cluster on the testbed.

One cluster (one node, one CPU) serves the tests that need Ray; the Jupyter server runs as a
subprocess with a token, so authentication is Jupyter's own. What Ray cannot be made to do on
demand (set cookies, stream events, refuse connections) is played by a small HTTP server of the
test on loopback, registered as a cluster like any other: a record, and a job dir whose
``connection.json`` names it.
"""

from __future__ import annotations

import http.server
import json
import os
import pwd
import re
import secrets
import shutil
import socketserver
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote, urlsplit

import pytest
import requests
import websocket

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.registry import ClusterRecord, Registry

from .helpers.faults import record_figure
from .helpers.jobs import last_state
from .helpers.server import (
    Head,
    JupyterServer,
    dashboard_log,
    free_port,
    head_of,
    jupyter_server,
    on_the_heads_node,
    ray_log_dir,
    start_cluster,
)
from .helpers.testbed import runuser, ssh_transport
from .helpers.waiting import wait_for

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
def server(root, testbed) -> Iterator[JupyterServer]:
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


def test_the_heads_relay_shows_the_clusters_certificate_and_still_asks_for_the_token(head):
    """What every client off the head uses: https whose certificate the cluster's CA signed (a
    client that trusts only the usual CAs refuses it before sending anything), and Ray's
    token still asked for behind it."""
    assert head.relay_url is not None and head.ca is not None
    url = head.relay_url + "api/cluster_status"
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, headers=head.headers(), timeout=10)  # the system's CAs only
    assert requests.get(url, verify=head.ca, timeout=10).status_code in (401, 403)
    response = requests.get(url, headers=head.headers(), verify=head.ca, timeout=10)
    assert response.status_code == 200 and response.json()["result"] is True


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


# -- big and endless answers stream through: Ray's log API -----------------------------------
LOG_LINE = "a line of the head's log, 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOP"


def as_cluster_user(cluster, script: str, *args: str, check: bool = True) -> int:
    """``sh -c script`` as the cluster's user on the head's node; its exit status."""
    argv = [*on_the_heads_node(cluster), "sh", "-c", script, "sh", *args]
    return run_sync(cluster.transport.run(argv, check=check)).returncode


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


class PeakRss(threading.Thread):
    """The highest RSS of a process, sampled every 20 ms while running."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self._stop_sampling = pid, rss_mb(pid), threading.Event()

    def run(self) -> None:
        while not self._stop_sampling.wait(0.02):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __enter__(self) -> PeakRss:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_sampling.set()
        self.join(5)


@pytest.fixture(scope="module")
def big_log(cluster) -> Iterator[tuple[str, int]]:
    """A 200 MB log file in the head's log directory, written by the cluster's user."""
    name, size = "jsr-proxy-big.log", 200_000_000
    path = f"{ray_log_dir(cluster)}/{name}"
    as_cluster_user(cluster, 'yes "$1" | head -c "$2" > "$3"', LOG_LINE, str(size), path)
    yield name, size
    as_cluster_user(cluster, 'rm -f -- "$1"', path)


@pytest.mark.parametrize("route", ["page", "token"])
def test_a_200_mb_log_streams_through_without_growing_the_server(
    server, cluster, head, big_log, route
):
    """Ray's log download (``api/v0/logs/file``, chunked, no length) through the proxy: the
    Jupyter server's RSS grows by less than 20 MB, even while the browser stops reading for
    a while (a proxy that buffered would hold the rest meanwhile)."""
    name, size = big_log
    query = f"api/v0/logs/file?node_ip={head.info.head_ip}&filename={name}&lines=-1"
    if route == "page":
        url, headers = link_of(server, cluster.id) + query, {}
    else:
        url, headers = server.url + dashboard(cluster) + query, server.headers()
    requests.get(url.replace(query, "api/version"), headers=headers, timeout=30)  # warm up
    baseline = rss_mb(server.proc.pid)
    received, paused, started = 0, False, time.monotonic()
    with (
        PeakRss(server.proc.pid) as rss,
        requests.get(url, headers=headers, stream=True, timeout=60) as response,
    ):
        assert response.status_code == 200, response.text[:500]
        for piece in response.iter_content(chunk_size=2**20):
            received += len(piece)
            if not paused and received > 20 * 2**20:
                paused = True
                time.sleep(3)  # the browser falls behind: the proxy must stop reading too
    sandboxed = response.headers["Content-Security-Policy"]
    assert sandboxed.startswith("sandbox") and response.headers["X-Content-Type-Options"]
    seconds = time.monotonic() - started
    record_figure(
        f"proxy: 200 MB log download ({route} route)",
        rss_growth_mb=round(rss.peak - baseline, 1),
        seconds=round(seconds, 1),
        mb_per_s=round(size / 1e6 / (seconds - 3), 1),
    )
    assert received == size
    assert rss.peak - baseline < 20, f"RSS {baseline:.1f} -> peak {rss.peak:.1f} MB"


@pytest.fixture
def appended_log(cluster, testbed) -> Iterator[str]:
    """A log file the cluster's user appends a timestamped line to every 0.5 s for 60 s."""
    name = f"jsr-proxy-follow-{os.getpid()}.log"
    path = f"{ray_log_dir(cluster)}/{name}"
    writer = (
        "import sys, time\n"
        "for i in range(120):\n"
        "    with open(sys.argv[1], 'a') as log:\n"
        "        log.write(f'tick {i} {time.time():.3f}\\n')\n"
        "    time.sleep(0.5)\n"
    )
    argv = [*runuser(testbed.user), *on_the_heads_node(cluster), "python3", "-c", writer, path]
    appender = subprocess.Popen(argv)
    try:
        wait_for(lambda: appender.poll() is None and log_exists(cluster, path), 30, "the log")
        yield name
    finally:
        appender.terminate()
        appender.wait(10)
        as_cluster_user(cluster, 'rm -f -- "$1"', path)


def log_exists(cluster, path: str) -> bool:
    return as_cluster_user(cluster, 'test -s "$1"', path, check=False) == 0


def test_a_never_ending_log_stream_passes_for_30_s_line_by_line(
    server, cluster, head, appended_log
):
    """``api/v0/logs/stream`` (Ray follows the file, never ends) through the capability route
    for 30 s: the answer is not cut, and each line arrives while the stream runs, soon after it
    was written (a proxy that buffered would hold them all, or time out)."""
    query = (
        f"api/v0/logs/stream?node_ip={head.info.head_ip}&filename={appended_log}"
        "&lines=1&interval=0.5"
    )
    arrivals: list[tuple[float, bytes]] = []
    started = time.monotonic()
    with requests.get(link_of(server, cluster.id) + query, stream=True, timeout=60) as response:
        assert response.status_code == 200, response.text[:500]
        pieces = response.iter_content(chunk_size=None)
        while time.monotonic() - started < 30:
            piece = next(pieces)  # StopIteration: the stream ended (it must not)
            arrivals.append((time.time(), piece))
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    lines = re.findall(rb"tick (\d+) ([0-9.]+)\n", b"".join(p for _, p in arrivals))
    assert len(lines) >= 40, lines[-3:]  # 0.5 s apart: about 60 in 30 s
    numbers = [int(n) for n, _ in lines]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # none lost
    lags = []
    for arrived, piece in arrivals:
        for _, written in re.findall(rb"tick (\d+) ([0-9.]+)\n", piece):
            lags.append(arrived - float(written))
    record_figure(
        "proxy: never-ending log stream",
        seconds=30,
        lines=len(lines),
        max_lag_s=round(max(lags), 2),
        median_lag_s=round(statistics.median(lags), 2),
    )
    assert max(lags) < 10, f"lines arrived up to {max(lags):.1f} s after being written"
    spread = arrivals[-1][0] - arrivals[0][0]
    assert spread > 25, f"all the lines arrived within {spread:.1f} s"


# -- SSH mode ---------------------------------------------------------------------------------
def listed_state(server: JupyterServer, cluster_id: str) -> str | None:
    """The state the server's clusters API shows (reconciled with Slurm) for a cluster."""
    listing = server.get("slurm-ray/api/clusters").json()["clusters"]
    return next((c["state"] for c in listing if c["id"] == cluster_id), None)


@pytest.fixture(scope="module")
def ssh_server(tmp_path_factory, testbed) -> Iterator[JupyterServer]:
    """A Jupyter server configured like one on a laptop: Slurm through the login node's sshd."""
    settings = {
        "JUPYTER_SLURM_RAY_LOGIN_HOST": testbed.ssh_host,
        "JUPYTER_SLURM_RAY_LOGIN_PORT": str(testbed.ssh_port),
        "JUPYTER_SLURM_RAY_LOGIN_USER": testbed.user,
        "JUPYTER_SLURM_RAY_SSH_KEY": testbed.key(testbed.user),
        "JUPYTER_SLURM_RAY_KNOWN_HOSTS": testbed.known_hosts,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        with jupyter_server(tmp_path_factory.mktemp("proxy-ssh"), testbed.user) as server:
            yield server


def test_an_ssh_target_is_proxied_through_an_ssh_forward(ssh_server, root, cluster, head, testbed):
    """A record made by a kernel on a laptop: the server reaches the head via the login node."""
    record = Registry(root / "state").load(cluster.id)
    assert record is not None
    record.target = ssh_transport(testbed).target
    registry = Registry(ssh_server.state_dir)
    registry.save(record)
    registry.store_token(record.id, head.token)
    wait_for(lambda: listed_state(ssh_server, record.id) == "READY", 30, "the server to agree")
    response = ssh_server.get(f"slurm-ray/dashboard/{record.id}/api/cluster_status")
    assert response.status_code == 200, response.text[:500]
    assert response.json()["result"] is True
    assert ssh_server.get(f"slurm-ray/dashboard/{record.id}/").status_code == 200
    log = ssh_server.log()
    forwarded = [line for line in log.splitlines() if f"dashboard of {record.id}" in line]
    assert forwarded and "via 127.0.0.1:" in forwarded[-1], log[-2000:]


# -- a backend that plays what Ray cannot be made to do ---------------------------------------
BACKEND_COOKIES = ("ray-authentication-token=from-the-backend; Path=/", "backend-session=1")
RAY_TOKEN = "token-of-the-fake-dashboard"


class _FakeDashboard(http.server.BaseHTTPRequestHandler):
    """Answers like a dashboard that sets cookies on every response, and records requests."""

    server: _FakeServer

    def do_GET(self) -> None:
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        if self.path.startswith("/events"):
            self._start(200, "text/event-stream")
            for event in ("one", "two"):
                self.wfile.write(f"data: {event}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.1)
        elif self.path.startswith("/page"):
            self._answer(200, "text/html", "<html><head><title>fake</title></head><body>ok</body>")
        elif self.path.startswith("/error"):
            self._answer(500, "text/plain", "the backend failed")
        elif self.path.startswith("/moved"):
            self._answer(302, "text/plain", "", Location="/page")
        else:
            self._answer(200, "text/plain", f"plain {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        self._answer(200, "text/plain", f"{self.command} {self.path}")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def _start(self, status: int, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for cookie in BACKEND_COOKIES:
            self.send_header("Set-Cookie", cookie)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def do_HEAD(self) -> None:
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        self._start(200, "text/plain", **{"Content-Length": "11"})

    def _answer(self, status: int, content_type: str, body: str, **headers: str) -> None:
        self._start(status, content_type, **headers, **{"Content-Length": str(len(body))})
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


class _FakeServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    seen: list[tuple[str, str, dict[str, str]]]


@dataclass
class FakeCluster:
    """A registered cluster whose "dashboard" is the fake backend (or nothing at all)."""

    id: str
    name: str
    job_id: str | None
    url: str  # the proxy path of its dashboard, relative to the server's URL
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def requests_to(self, marker: str) -> list[tuple[str, str, dict[str, str]]]:
        return [r for r in self.seen if marker in r[1]]


@pytest.fixture(scope="module")
def backend() -> Iterator[_FakeServer]:
    httpd = _FakeServer(("127.0.0.1", 0), _FakeDashboard)
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def submit_sleep_job(user: str, seconds: int) -> str:
    """A real Slurm job that only sleeps (the server asks Slurm about every record's job)."""
    argv = ["runuser", "-u", user, "--", "sbatch", "--parsable", "-N1", "-n1", "-c1"]
    argv += ["--mem=50M", "-t", "15", "--chdir=/tmp", "-o", "/dev/null", "-J", "jsr-proxy-test"]
    done = subprocess.run(
        [*argv, "--wrap", f"sleep {seconds}"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def register(server, testbed) -> Iterator:
    """``register(name, port, state, job_id)``: a record, and a job dir naming that port.

    Without a job id the record's state stands (the server asks Slurm only about jobs).
    """
    registry = Registry(server.state_dir)
    made: list[tuple[str, str]] = []
    user = pwd.getpwnam(testbed.user)

    def register_cluster(
        name: str, port: int | None, state: str = "READY", job_id: str | None = None
    ) -> FakeCluster:
        cluster_id = f"{name}-{os.urandom(4).hex()}"
        job_dir = tempfile.mkdtemp(prefix="jsr-fake-", dir="/tmp")
        if port is not None:
            connection = {
                "head_ip": "127.0.0.1",
                "client_port": 1,
                "dashboard_port": port,
                "gcs_address": "127.0.0.1:1",
                "ray_version": "0",
                "python_version": "0",
                "node_count": 1,
                "verified": {"uid": user.pw_uid, "listeners": {"client": 1, "dashboard": port}},
            }
            Path(job_dir, "connection.json").write_text(json.dumps(connection))
        for path in (job_dir, *Path(job_dir).iterdir()):
            os.chown(path, user.pw_uid, user.pw_gid)
        command_prefix = ["runuser", "-u", testbed.user, "--"]
        record = ClusterRecord.from_dict(
            {
                "id": cluster_id,
                "name": name,
                "target": {"kind": "local", "command_prefix": command_prefix},
                "job_dir": job_dir,
                "job_id": job_id,
                "state": state,
            }
        )
        registry.save(record)
        registry.store_token(cluster_id, RAY_TOKEN)
        made.append((cluster_id, job_dir))
        return FakeCluster(cluster_id, name, job_id, f"slurm-ray/dashboard/{cluster_id}/")

    yield register_cluster
    for cluster_id, job_dir in made:
        registry.delete(cluster_id)
        shutil.rmtree(job_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def fake(register, backend) -> FakeCluster:
    cluster = register("fake", backend.server_address[1])
    cluster.seen = backend.seen
    return cluster


@pytest.fixture
def browser(server) -> requests.Session:
    """A browser's session: Jupyter's login cookie, and no token in later requests."""
    session = requests.Session()
    assert session.get(f"{server.url}api/status?token={server.token}", timeout=30).ok
    assert any(cookie.name.startswith("username-") for cookie in session.cookies)
    return session


def set_cookies(response: requests.Response) -> list[str]:
    return response.raw.headers.getlist("Set-Cookie")


def backend_cookies(response: requests.Response) -> list[str]:
    names = [cookie.split("=", 1)[0] for cookie in BACKEND_COOKIES]
    return [c for c in set_cookies(response) if c.split("=", 1)[0] in names]


# -- Ray's cookies stay between the proxy and Ray ---------------------------------------------
def test_backend_cookies_are_dropped_from_buffered_responses(server, fake):
    statuses = {}
    for path in ("plain", "page", "error", "moved"):
        response = server.get(fake.url + path)
        statuses[path] = response.status_code
        assert backend_cookies(response) == [], (path, set_cookies(response))
    assert statuses == {"plain": 200, "page": 200, "error": 500, "moved": 302}


def test_backend_cookies_are_dropped_from_event_streams(server, fake):
    response = server.get(
        fake.url + "events", headers={**server.headers(), "Accept": "text/event-stream"}
    )
    assert response.status_code == 200
    assert response.text == "data: one\n\ndata: two\n\n"
    assert response.headers["Content-Type"] == "text/event-stream"
    assert backend_cookies(response) == [], set_cookies(response)


def test_jupyters_own_login_cookie_still_reaches_the_browser(server, fake):
    for accept in ("*/*", "text/event-stream"):
        response = requests.get(
            f"{server.url}{fake.url}events?token={server.token}",
            headers={"Accept": accept},
            timeout=30,
        )
        assert response.status_code == 200
        names = [cookie.split("=", 1)[0] for cookie in set_cookies(response)]
        assert names and all(name.startswith("username-") for name in names), names


# -- writes: the origin check keys on how Jupyter authenticated the request ------------------
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def test_cookie_authenticated_writes_must_come_from_jupyters_origin(server, fake, browser):
    base = server.url + fake.url
    own = server.url.rstrip("/")
    for method in WRITES:
        for origin in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {}):
            marker = f"refused-{method}-{len(origin)}"
            refused = browser.request(method, base + marker, data="{}", headers=origin)
            assert refused.status_code == 403 and "cross-site" in refused.text, (method, origin)
            assert fake.requests_to(marker) == []
        allowed = browser.request(
            method, base + f"own-{method}", data="{}", headers={"Origin": own}
        )
        assert allowed.status_code == 200 and allowed.text == f"{method} /own-{method}"


def test_a_referer_from_jupyter_stands_in_for_a_missing_origin(server, fake, browser):
    base = server.url + fake.url
    ok = browser.post(base + "by-referer", headers={"Referer": f"{server.url}lab"})
    assert ok.status_code == 200
    refused = browser.post(base + "by-referer-evil", headers={"Referer": "http://evil.example/"})
    assert refused.status_code == 403


def test_a_bogus_authorization_header_does_not_skip_the_origin_check(server, fake, browser):
    """The login cookie authenticates it, so it is a cookie-authenticated write."""
    for header in ("token not-the-token", "Bearer whatever", "nonsense"):
        refused = browser.post(server.url + fake.url + "bogus", headers={"Authorization": header})
        assert refused.status_code == 403 and "cross-site" in refused.text, header
    assert fake.requests_to("bogus") == []


def test_token_authenticated_writes_need_no_origin(server, fake):
    by_header = server.request("POST", fake.url + "by-header", data="{}")
    assert by_header.status_code == 200 and by_header.text == "POST /by-header"
    by_query = requests.post(
        f"{server.url}{fake.url}by-query?token={server.token}", data="{}", timeout=30
    )
    assert by_query.status_code == 200 and by_query.text == "POST /by-query"
    forwarded = fake.requests_to("/by-header") + fake.requests_to("/by-query")
    assert len(forwarded) == 2
    for _method, path, headers in forwarded:
        assert "token=" not in path and "Authorization" not in headers and "Cookie" not in headers
        assert headers["X-Ray-Authorization"] == f"Bearer {RAY_TOKEN}"


def test_cookie_authenticated_reads_need_no_origin(server, fake, browser):
    assert browser.get(server.url + fake.url + "read").text == "plain /read"


# -- a dashboard that is not there is a page that says why ------------------------------------
def assert_page(response: requests.Response, status: int, text: str) -> None:
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["Content-Type"].startswith("text/html")
    assert text in response.text, response.text
    assert "Traceback" not in response.text


def test_an_ended_cluster_is_a_503_page_naming_it_and_its_state(server, register):
    ended = register("analysis", None, state="CANCELLED", job_id="123")
    said = f"Ray cluster analysis (job {ended.job_id}) is CANCELLED: its dashboard is gone."
    for path in ("", "api/cluster_status", "static/x.js"):
        assert_page(server.get(ended.url + path), 503, said)
    assert_page(server.request("POST", ended.url + "api/jobs/", json={}), 503, said)


def test_a_ready_cluster_whose_dashboard_refuses_is_a_503_page(server, register):
    gone = register("stale", free_port(), state="READY")
    said = "Ray cluster <code>stale</code> was last seen READY, but its dashboard does not answer"
    assert_page(server.get(gone.url), 503, said)
    assert_page(server.get(gone.url + "api/jobs/"), 503, said)
    streaming = {**server.headers(), "Accept": "text/event-stream"}
    assert_page(server.get(gone.url + "events", headers=streaming), 503, said)
    assert_page(server.request("POST", gone.url + "api/jobs/", json={}), 503, said)
    link = server.request("POST", f"slurm-ray/dashboard-links/{gone.id}").json()["url"]
    assert_page(requests.get(server.url + link.lstrip("/"), timeout=30), 503, said)


def test_a_cluster_not_up_yet_is_a_503_page(server, register):
    starting = register("queued", None, state="PENDING")
    response = server.get(starting.url)
    assert_page(response, 503, "Ray cluster queued ")
    assert "not ready yet" in response.text
    assert response.headers["Retry-After"] == "5"


def test_an_unknown_cluster_is_a_404_page(server):
    assert_page(server.get("slurm-ray/dashboard/nosuch-0000/"), 404, "no Ray cluster")


# -- the sandboxed dashboard: capability URLs -------------------------------------------------
CAPABILITY_URL = re.compile(r"^/slurm-ray/dashboard/([a-z0-9-]+)/~([A-Za-z0-9_-]{40,})/$")


def link_of(server: JupyterServer, cluster_id: str) -> str:
    response = server.request("POST", f"slurm-ray/dashboard-links/{cluster_id}")
    assert response.status_code == 201, response.text
    return server.url.rstrip("/") + response.json()["url"]


def test_a_dashboard_link_is_minted_for_a_logged_in_user_only(server, fake, browser):
    path = f"slurm-ray/dashboard-links/{fake.id}"
    minted = server.request("POST", path)
    assert minted.status_code == 201
    match = CAPABILITY_URL.match(minted.json()["url"])
    assert match and match.group(1) == fake.id, minted.json()
    assert server.request("POST", path).json() == minted.json()  # one per cluster, reused
    assert server.request("POST", path, headers={}).status_code == 403
    no_xsrf = browser.post(server.url + path, headers={"Origin": server.url.rstrip("/")})
    assert no_xsrf.status_code == 403  # Jupyter's API rules: a cookie needs the XSRF token
    assert server.request("POST", "slurm-ray/dashboard-links/nosuch-0000").status_code == 404


def test_a_capability_url_needs_no_jupyter_login_and_forwards_no_credentials(server, fake):
    link = link_of(server, fake.id)
    response = requests.get(link + "by-capability?a=1", timeout=30)
    assert response.status_code == 200 and response.text == "plain /by-capability?a=1"
    (_method, _path, headers), *_ = fake.requests_to("by-capability")
    assert headers["X-Ray-Authorization"] == f"Bearer {RAY_TOKEN}"
    assert "Cookie" not in headers and "Authorization" not in headers
    assert backend_cookies(response) == []


def test_a_capability_opens_only_its_own_cluster(server, fake, register, backend):
    other = register("other", backend.server_address[1])
    capability = urlsplit(link_of(server, fake.id)).path.split("/")[4]
    assert capability.startswith("~")
    borrowed = requests.get(f"{server.url}{other.url}{capability}/plain", timeout=30)
    assert_page(borrowed, 404, "This dashboard link is not valid")
    made_up = requests.get(f"{server.url}{fake.url}~{'x' * 43}/plain", timeout=30)
    assert_page(made_up, 404, "This dashboard link is not valid")


def test_the_dashboards_pages_are_sandboxed_and_can_use_storage(server, fake):
    for url in (link_of(server, fake.id) + "page", server.url + fake.url + "page"):
        response = requests.get(url, headers=server.headers(), timeout=30)
        policy = response.headers["Content-Security-Policy"]
        assert policy.startswith("sandbox allow-scripts") and "allow-same-origin" not in policy
        assert response.headers["Referrer-Policy"] == "no-referrer"
        assert response.text.startswith("<html><head><script>(function () {")
        assert "memoryStorage" in response.text
        assert response.text.endswith("</script><title>fake</title></head><body>ok</body>")


def test_requests_from_the_sandboxed_page_pass_cors(server, fake):
    """The page's origin is opaque ("null"), so its own requests are cross-origin."""
    link = link_of(server, fake.id)
    preflight = requests.options(
        link + "api/jobs/preflight",
        headers={
            "Origin": "null",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
        timeout=30,
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "null"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert preflight.headers["Access-Control-Allow-Headers"] == "content-type"
    assert fake.requests_to("preflight") == []  # answered by the proxy, not forwarded
    posted = requests.post(link + "api/jobs/sandboxed", headers={"Origin": "null"}, timeout=30)
    assert posted.status_code == 200 and posted.text == "POST /api/jobs/sandboxed"
    assert posted.headers["Access-Control-Allow-Origin"] == "null"
    elsewhere = requests.get(link + "plain", headers={"Origin": "http://evil.example"}, timeout=30)
    assert "Access-Control-Allow-Origin" not in elsewhere.headers


def test_a_browsers_navigation_is_redirected_to_the_sandboxed_url(server, fake, browser):
    page = browser.get(
        f"{server.url}{fake.url}page?x=1&token={server.token}",
        headers={"Sec-Fetch-Dest": "document"},
        allow_redirects=False,
    )
    assert page.status_code == 302
    location = page.headers["Location"]
    assert re.fullmatch(
        rf"/slurm-ray/dashboard/{fake.id}/~[A-Za-z0-9_-]{{40,}}/page\?x=1", location
    )
    in_frame = browser.get(
        server.url + fake.url, headers={"Sec-Fetch-Dest": "iframe"}, allow_redirects=False
    )
    assert in_frame.headers["Location"].endswith("/")
    script = browser.get(server.url + fake.url + "page", headers={"Sec-Fetch-Dest": "empty"})
    assert script.status_code == 200 and "<title>fake</title>" in script.text


def test_the_page_route_keeps_redirects_under_it_drops_cookies_and_logs_no_capability(server, fake):
    """The route the dashboard tab polls: no Ray cookie, the head's redirects stay under the
    capability, and the capability (the route's whole authorization) never reaches the log."""
    link = link_of(server, fake.id)
    capability = urlsplit(link).path.split("/")[4]
    statuses = {}
    for path in ("plain", "page", "error", "moved"):
        response = requests.get(link + path, allow_redirects=False, timeout=30)
        statuses[path] = response.status_code
        assert backend_cookies(response) == [], (path, set_cookies(response))
    assert statuses == {"plain": 200, "page": 200, "error": 500, "moved": 302}
    moved = requests.get(link + "moved", allow_redirects=False, timeout=30)
    assert moved.headers["Location"] == urlsplit(link).path + "page"
    head = requests.head(link + "plain", timeout=30)
    assert (
        head.status_code == 200 and head.text == "" and fake.requests_to("plain")[-1][0] == "HEAD"
    )
    assert capability[1:] not in server.log_path.read_text()


def test_a_capability_url_without_its_slash_is_redirected(server, fake):
    link = link_of(server, fake.id)
    response = requests.get(link.rstrip("/") + "?x=1", allow_redirects=False, timeout=30)
    assert response.status_code == 302
    assert response.headers["Location"] == urlsplit(link).path + "?x=1"


def test_a_websocket_through_a_capability_url_streams_a_job_log(server, cluster):
    submitted = server.request(
        "POST", dashboard(cluster) + "api/jobs/", json={"entrypoint": "echo via-capability"}
    )
    job_id = submitted.json()["submission_id"]
    link = link_of(server, cluster.id)
    url = link.replace("http", "ws", 1) + f"api/jobs/{job_id}/logs/tail"
    ws = websocket.create_connection(url, header=["Origin: null"], timeout=60)
    try:
        text = ""
        deadline = time.monotonic() + 60
        while "via-capability" not in text and time.monotonic() < deadline:
            text += ws.recv()
    finally:
        ws.close()
    assert "via-capability" in text


def test_a_refused_websocket_on_a_capability_url_logs_no_capability(server, fake):
    """A websocket upgrade refused on the capability route (here: a capability this server
    never minted) is logged without the capability: Tornado's own lines name the whole URL."""
    link = link_of(server, fake.id)
    forged = "~" + secrets.token_urlsafe(30)
    url = re.sub(r"/~[^/]+/", f"/{forged}/", link).replace("http", "ws", 1) + "api/x/tail"
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(url, header=["Origin: null"], timeout=30)
    assert refused.value.status_code == 404
    wait_for(lambda: "/api/x/tail" in server.log_path.read_text(), 10, "the refusal in the log")
    log = server.log_path.read_text()
    assert f"404 GET /slurm-ray/dashboard/{fake.id}/~…/api/x/tail" in log
    assert forged[1:] not in log


# -- last: it asks Slurm about a job of its own ---------------------------------------------
def test_a_ready_record_whose_job_has_ended_is_a_503_page(server, register, testbed):
    """The record still says READY (its owner died); Slurm says the job is over."""
    job_id = submit_sleep_job(testbed.user, 0)
    wait_for(lambda: last_state(job_id) == "COMPLETED", 60, f"job {job_id} to end")
    stale = register("leftover", free_port(), state="READY", job_id=job_id)
    response = server.get(stale.url)
    assert_page(response, 503, f"Ray cluster leftover (job {job_id}) is ")
    assert "its dashboard is gone." in response.text
