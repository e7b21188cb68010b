"""The one helper for the head's dashboard HTTP (bootstrap/dashhttp.py) and the clients built on
it, against servers on loopback with every proxy variable set to a recorder of our own: the
token in one header form, straight to the dashboard (never to the proxy, never on a redirect),
a connect timeout apart from the read timeout, a size limit; Ray's Jobs client and Ray Client's
gRPC channel as ``job_client()`` and ``connect`` configure them."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap import dashhttp
from jupyter_slurm_ray.bootstrap.dashhttp import DashboardHTTPError, get_json, token_headers

from ..helpers.bootstrap import bootstrap_module
from ..helpers.paths import child_environment
from ..helpers.proxyrecorder import ProxyRecorder, proxy_environment

TOKEN = "s3cret-token-of-the-cluster"
Answer = Callable[[http.server.BaseHTTPRequestHandler], None]


@dataclass
class Dashboard:
    """A loopback HTTP server standing in for Ray's dashboard: what each request carried."""

    server: http.server.ThreadingHTTPServer
    routes: dict[str, Answer]
    seen: list[dict] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def headers_seen(self) -> list[dict[str, str]]:
        return [request["headers"] for request in self.seen]


def send(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes, **headers) -> None:
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), **headers}.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    handler.wfile.write(body)


def json_answer(payload: object, status: int = 200) -> Answer:
    """As Ray's dashboard answers: JSON, and ``Connection: close`` (on Python 3.13 the reply
    then closes itself, and its socket, once the body is read)."""
    body = json.dumps(payload).encode()
    return lambda handler: send(
        handler, status, body, Content_Type="application/json", Connection="close"
    )


@pytest.fixture
def dashboard() -> Iterator[Dashboard]:
    routes: dict[str, Answer] = {}
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = {"method": self.command, "path": self.path, "body": body}
            seen.append({**request, "headers": dict(self.headers)})
            answer = routes.get(self.path.split("?")[0])
            if answer is None:
                send(self, 404, b"{}")
            else:
                answer(self)

        do_GET = do_POST = do_PUT = do_DELETE = _any

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield Dashboard(server, routes, seen)
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(monkeypatch) -> Iterator[ProxyRecorder]:
    """A recording proxy, named by every proxy variable of this process."""
    recorder = ProxyRecorder()
    for name, value in proxy_environment(recorder.url).items():
        monkeypatch.setenv(name, value)
    yield recorder
    recorder.close()


def test_the_token_goes_in_one_header_form(dashboard):
    dashboard.routes["/api/cluster_status"] = json_answer({"data": {"ok": 1}})
    assert get_json(dashboard.url("api/cluster_status"), TOKEN) == {"data": {"ok": 1}}
    (headers,) = dashboard.headers_seen()
    carrying = {name for name, value in headers.items() if TOKEN in value}
    assert carrying == {"X-Ray-Authorization"}
    assert token_headers(TOKEN) == {dashhttp.TOKEN_HEADER: headers["X-Ray-Authorization"]}
    assert headers["X-Ray-Authorization"] == f"Bearer {TOKEN}"
    assert "Authorization" not in headers and "Cookie" not in headers


def test_no_proxy_even_when_every_proxy_variable_is_set(dashboard, proxy):
    dashboard.routes["/api/v0/nodes"] = json_answer({"data": {"result": {"result": []}}})
    url = dashboard.url("api/v0/nodes?limit=1000")
    assert get_json(url, TOKEN) == {"data": {"result": {"result": []}}}
    assert len(dashboard.seen) == 1 and proxy.seen == []
    # what adapt's reader did before (urlopen): the same request went to the proxy, token and all
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(OSError):
        urllib.request.urlopen(request, timeout=5)
    assert len(proxy.seen) == 1 and TOKEN in proxy.seen[0]["request"]


def test_a_redirect_is_not_followed_with_the_token(dashboard, proxy):
    elsewhere = ProxyRecorder()  # where a redirect points: must see nothing
    location = f"{elsewhere.url}/steal"
    dashboard.routes["/api/jobs"] = lambda h: send(h, 302, b"", Location=location)
    with pytest.raises(DashboardHTTPError) as refused:
        get_json(dashboard.url("api/jobs"), TOKEN)
    elsewhere.close()
    assert refused.value.status == 302
    assert elsewhere.seen == [] and proxy.seen == []


def test_the_connect_timeout_bounds_a_dashboard_that_does_not_accept():
    # a listener whose backlog is full: the kernel drops further SYNs, as for a lost host
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=1)
    started = time.monotonic()
    with pytest.raises(DashboardHTTPError, match="timed out"):
        get_json(f"http://127.0.0.1:{port}/api/version", TOKEN, connect_timeout=0.3)
    assert time.monotonic() - started < 2.0  # the read timeout (5 s) was not what ended it
    filler.close()
    listener.close()


def test_the_read_timeout_bounds_a_dashboard_that_never_answers(dashboard):
    dashboard.routes["/api/stuck"] = lambda handler: time.sleep(3)
    started = time.monotonic()
    with pytest.raises(DashboardHTTPError, match="timed out"):
        get_json(dashboard.url("api/stuck"), TOKEN, read_timeout=0.4)
    assert time.monotonic() - started < 2.0


def test_the_read_timeout_bounds_the_whole_body_not_each_byte(dashboard):
    def drip(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        with contextlib.suppress(OSError):  # the client hangs up
            for _ in range(100):  # one byte every 0.1 s: each wait is short, the whole 10 s
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.1)

    dashboard.routes["/api/drip"] = drip
    started = time.monotonic()
    with pytest.raises(DashboardHTTPError, match=r"timed out|read timeout"):
        get_json(dashboard.url("api/drip"), TOKEN, read_timeout=0.6)
    assert time.monotonic() - started < 2.0


def test_a_reply_over_the_size_limit_is_refused(dashboard):
    big = json.dumps({"data": "x" * 5000}).encode()
    dashboard.routes["/declared"] = lambda h: send(h, 200, big)

    def chunked(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for _ in range(10):
            handler.wfile.write(b"3e8\r\n" + b" " * 1000 + b"\r\n")
        handler.wfile.write(b"0\r\n\r\n")

    dashboard.routes["/chunked"] = chunked
    for path in ("declared", "chunked"):
        with pytest.raises(DashboardHTTPError, match="over 4096"):
            get_json(dashboard.url(path), TOKEN, max_bytes=4096)
    assert get_json(dashboard.url("declared"), TOKEN, max_bytes=len(big)) == json.loads(big)


def test_an_error_status_or_a_body_not_json_is_one_error(dashboard):
    dashboard.routes["/api/denied"] = json_answer({"error": "no"}, status=401)
    dashboard.routes["/api/page"] = lambda h: send(h, 200, b"<html>", Content_Type="text/html")
    with pytest.raises(DashboardHTTPError) as denied:
        get_json(dashboard.url("api/denied"), TOKEN)
    assert denied.value.status == 401 and "HTTP 401" in str(denied.value)
    with pytest.raises(DashboardHTTPError, match="not JSON"):
        get_json(dashboard.url("api/page"), TOKEN)
    with pytest.raises(ValueError, match="not a dashboard URL"):
        get_json("https://127.0.0.1/api", TOKEN)


def test_a_refused_connection_is_one_error():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(DashboardHTTPError, match=f"127.0.0.1:{port}/api/version"):
        get_json(f"http://127.0.0.1:{port}/api/version", TOKEN)


def test_an_ipv6_address_is_put_in_brackets():
    assert dashhttp.dashboard_url("10.0.0.1", 8265) == "http://10.0.0.1:8265/"
    assert dashhttp.dashboard_url("fd00::1", 8265, "/api/v0/nodes") == (
        "http://[fd00::1]:8265/api/v0/nodes"
    )


def test_the_bootstraps_dashboard_asks_directly_and_tells_not_answering_apart(dashboard, proxy):
    dashapi = bootstrap_module("dashapi")  # imported top-level, as the job's Python does
    rows = [
        {"node_ip": "10.0.0.2", "node_id": "b", "state": "ALIVE",
         "resources_total": {"slurm_ray_node": 1}},
        {"node_ip": "10.0.0.3", "node_id": "c", "state": "DEAD",
         "resources_total": {"slurm_ray_node": 1}},
    ]  # fmt: skip
    dashboard.routes["/api/v0/nodes"] = json_answer({"data": {"result": {"result": rows}}})
    head = dashapi.Dashboard("127.0.0.1", dashboard.port, TOKEN, lambda: True)
    assert head.alive_nodes() == [dashapi.AliveNode("10.0.0.2", "b")]
    assert dashboard.seen[0]["path"] == "/api/v0/nodes?limit=1000"
    assert dashboard.seen[0]["headers"]["X-Ray-Authorization"] == f"Bearer {TOKEN}"
    dashboard.routes["/api/v0/nodes"] = json_answer({"error": "forbidden"}, status=403)
    assert head.rows() is None and head.alive_nodes() is None  # not answering is not "gone"
    assert proxy.seen == []


def test_the_bootstraps_dashboard_sends_nothing_where_the_listener_is_not_verified(dashboard):
    dashapi = bootstrap_module("dashapi")
    dashboard.routes["/api/v0/nodes"] = json_answer({"data": {"result": {"result": []}}})
    asked: list[bool] = []

    def not_ours() -> bool:
        asked.append(True)
        return False

    head = dashapi.Dashboard("127.0.0.1", dashboard.port, TOKEN, not_ours)
    assert head.alive_nodes() is None
    assert asked == [True] and dashboard.seen == []  # connected, checked, nothing sent


def test_the_package_and_the_bootstrap_share_one_module():
    dashapi = bootstrap_module("dashapi")
    shipped = sys.modules["dashhttp"]
    assert dashapi.get_json is shipped.get_json
    assert Path(shipped.__file__).read_text() == Path(dashhttp.__file__).read_text()
    from jupyter_slurm_ray.job.shipping import bootstrap_files

    assert bootstrap_files()["dashhttp.py"] == Path(dashhttp.__file__).read_text()


def _run_python(code: str, env: dict[str, str], *args: str, timeout: float = 120) -> dict:
    """``code`` in a fresh Python (Ray's global state stays out of this process); its last
    line is JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_environment(env),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


JOBS_CLIENT = """
import json, os, sys
from jupyter_slurm_ray.client.connect import set_client_environment
from jupyter_slurm_ray.client.rayjobs import DirectJobSubmissionClient
set_client_environment(os.environ["TOKEN_FILE"], 5)  # token auth on, as after a connect
client = DirectJobSubmissionClient(sys.argv[1], os.environ["TOKEN"])
job = client.submit_job(entrypoint="echo hello")
logs = client.get_job_logs(job)
try:
    from ray.job_submission import JobSubmissionClient  # Ray's own, as job_client() gave it
    headers = {"X-Ray-Authorization": "Bearer " + os.environ["TOKEN"]}
    JobSubmissionClient(sys.argv[1], headers=headers)
    plain = "answered"
except Exception as exc:
    plain = type(exc).__name__
print(json.dumps({"job": job, "logs": logs, "plain": plain}))
"""


def test_the_jobs_client_goes_to_its_dashboard_only_with_one_header(dashboard, tmp_path):
    """Proxy variables, ``$RAY_ADDRESS``, a ``.netrc`` and Ray's token auth all set: the
    requests still reach the dashboard alone, with ``X-Ray-Authorization`` only."""
    version = {"ray_version": _installed_ray(), "ray_commit": "x", "version": "4"}
    dashboard.routes["/api/version"] = json_answer(version)
    dashboard.routes["/api/jobs/"] = json_answer({"job_id": "j1", "submission_id": "raysubmit_1"})
    dashboard.routes["/api/jobs/raysubmit_1/logs"] = json_answer({"logs": "hello\n"})
    proxy = ProxyRecorder()
    elsewhere = ProxyRecorder()  # what $RAY_ADDRESS names
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login someone password netrc-secret\n")
    (tmp_path / ".netrc").chmod(0o600)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    env = {
        **proxy_environment(proxy.url),
        "RAY_ADDRESS": elsewhere.url,
        "RAY_API_SERVER_ADDRESS": elsewhere.url,
        "HOME": str(tmp_path),
        "NETRC": str(tmp_path / ".netrc"),
        "TOKEN": TOKEN,
        "TOKEN_FILE": str(token_file),
    }
    try:
        got = _run_python(JOBS_CLIENT, env, dashboard.url(""))
    finally:
        proxy.close()
        elsewhere.close()
    assert got["job"] == "raysubmit_1" and got["logs"] == "hello\n"
    assert [r["method"] + " " + r["path"] for r in dashboard.seen] == [
        "GET /api/version",
        "POST /api/jobs/",
        "GET /api/jobs/raysubmit_1/logs",
    ]
    for headers in dashboard.headers_seen():
        assert headers["X-Ray-Authorization"] == f"Bearer {TOKEN}"
        assert "Authorization" not in headers  # neither Ray's second form nor .netrc's
    # Ray's own client, given the same address, went where $RAY_API_SERVER_ADDRESS says,
    # through the proxy; nothing for our dashboard went there
    assert got["plain"] != "answered" and proxy.seen
    for request in proxy.seen:
        assert request["request"].startswith(f"GET {elsewhere.url}/api/version ")


GRPC_CHANNEL = """
import json, socket, threading, grpc
from ray.util.client.common import GRPC_OPTIONS
from ray._private.grpc_utils import init_grpc_channel
from jupyter_slurm_ray.client.connect import direct_ray_client_channel

def head():
    \"\"\"A listener standing in for a head's client port: its port, the connections it got.\"\"\"
    listener, reached = socket.create_server(("127.0.0.1", 0)), []
    def accept():
        while True:
            reached.append(listener.accept()[0])
    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], reached

def try_channel(port):
    channel = init_grpc_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=2)
    except grpc.FutureTimeoutError:
        pass
    channel.close()

first, first_reached = head()
try_channel(first)  # Ray's options as RAY_grpc_enable_http_proxy=1 made them
direct_ray_client_channel()
second, second_reached = head()
try_channel(second)
print(json.dumps({"first": [first, len(first_reached)], "second": [second, len(second_reached)]}))
"""


def test_ray_clients_grpc_channel_ignores_the_proxy_variables():
    """With ``RAY_grpc_enable_http_proxy=1`` Ray's channel options honour the proxy variables
    (a CONNECT reaches the proxy instead of the head); after ``direct_ray_client_channel`` Ray
    Client's channel goes to the head's port itself."""
    proxy = ProxyRecorder()
    env = {**proxy_environment(proxy.url), "RAY_grpc_enable_http_proxy": "1"}
    try:
        got = _run_python(GRPC_CHANNEL, env)
    finally:
        proxy.close()
    (first, first_reached), (_, second_reached) = got["first"], got["second"]
    targets = {seen["request"].split(" ")[:2][1] for seen in proxy.seen}
    assert first_reached == 0 and targets == {f"127.0.0.1:{first}"}
    assert second_reached >= 1


def test_grpc_exemptions_add_loopback_to_what_grpc_reads():
    loopback = "127.0.0.1,localhost,::1"
    assert dashhttp.grpc_exemptions({"no_proxy": ".site.edu"}) == {}  # no proxy: no change
    proxied = {"https_proxy": "http://proxy:3128"}
    assert dashhttp.grpc_exemptions(proxied) == {"no_grpc_proxy": loopback}
    site = {**proxied, "no_proxy": ".site.edu, 10.0.0.0/8"}
    assert dashhttp.grpc_exemptions(site) == {"no_grpc_proxy": f".site.edu,10.0.0.0/8,{loopback}"}
    # gRPC reads no_grpc_proxy before no_proxy, even empty; an entry is not repeated
    own = {**site, "no_grpc_proxy": "localhost"}
    assert dashhttp.grpc_exemptions(own) == {"no_grpc_proxy": "localhost,127.0.0.1,::1"}


def test_rays_processes_get_the_jobs_proxies_and_loopback_exempt_for_grpc(tmp_path, monkeypatch):
    rayargs = bootstrap_module("rayargs")
    config_class = bootstrap_module("jsr_base").Config
    ports = {"autoscaler_metrics": 20001, "dashboard_metrics": 20002}
    for name, value in proxy_environment("http://proxy:3128").items():
        monkeypatch.setenv(name, value)
    env = rayargs.ray_environment(config_class(cluster_id="c-1"), tmp_path, ports)
    assert env["no_grpc_proxy"] == "127.0.0.1,localhost,::1"
    changed = {k for k, v in env.items() if k in proxy_environment("") and v != os.environ[k]}
    assert changed == {"no_grpc_proxy"}  # every other proxy variable as the job set it
    mine = config_class(cluster_id="c-1", env={"no_grpc_proxy": ""})  # the user's env too
    assert rayargs.ray_environment(mine, tmp_path, ports)["no_grpc_proxy"] == (
        "127.0.0.1,localhost,::1"
    )


PLAIN_GRPC_CHANNEL = """
import json, os, socket, sys, threading, grpc
from jupyter_slurm_ray.bootstrap.dashhttp import grpc_exemptions

def head():
    listener, reached = socket.create_server(("127.0.0.1", 0)), []
    def accept():
        while True:
            reached.append(listener.accept()[0])
    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], reached

def call_with_the_token(port):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")  # default options, as OTel's exporter
    try:
        channel.unary_unary("/opentelemetry.Metrics/Export")(
            b"", metadata=[("authorization", "Bearer " + sys.argv[1])], timeout=2
        )
    except grpc.RpcError:
        pass
    channel.close()

first, first_reached = head()
call_with_the_token(first)
os.environ.update(grpc_exemptions(os.environ))
second, second_reached = head()
call_with_the_token(second)
print(json.dumps({"first": [first, len(first_reached)], "second": [second, len(second_reached)]}))
"""


def test_a_grpc_call_with_default_options_goes_direct_to_loopback_once_exempted():
    """What Ray's metrics exporter does (gRPC's default channel options, 127.0.0.1, the token
    in its metadata): through the proxy named by the environment, token and all, until
    ``grpc_exemptions`` is applied."""
    proxy = ProxyRecorder()
    try:
        got = _run_python(PLAIN_GRPC_CHANNEL, proxy_environment(proxy.url), TOKEN)
    finally:
        proxy.close()
    (first, first_reached), (_, second_reached) = got["first"], got["second"]
    assert first_reached == 0 and proxy.seen
    for seen in proxy.seen:
        assert seen["request"].startswith(f"CONNECT 127.0.0.1:{first} ")
    assert any(TOKEN in seen["tunnelled"] for seen in proxy.seen)  # the recorder sees it
    assert second_reached >= 1


def _installed_ray() -> str:
    from importlib import metadata

    return metadata.version("ray")
