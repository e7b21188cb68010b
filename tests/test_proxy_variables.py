"""No token leaves the machine by accident (issue 18, item 3), on the testbed: every proxy
variable (both cases, ``grpc_proxy`` too, ``NO_PROXY`` empty) names a recording proxy that bob
holds on a compute node, in the kernel's environment, the Jupyter server's and the job's (the
cluster's setup lines export them, as a site's module could). One real cluster then serves
every path that carries the cluster's token — Ray Client and a task on every node, the Ray Jobs
client, adapt's reads of ``api/cluster_status``, the bootstrap's own polls, the dashboard
opened through the Jupyter server's proxy (page, APIs, an event stream, a websocket, the
sandboxed page route), and Ray's own metrics exporter on every node — and nothing may reach
bob's proxy but Ray's tokenless telemetry. Ray's processes on the nodes see the proxy settings
the job gave them, with loopback exempt for gRPC (``no_grpc_proxy``, see dashhttp.py).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import websocket

from .helpers.bootstrap import NODE_NETNS, user_uid
from .helpers.clusters import wait_until_nothing_left
from .helpers.paths import VENV_ACTIVATE, child_environment
from .helpers.proxyrecorder import proxy_environment, recorder_argv
from .helpers.server import JupyterServer, jupyter_server
from .helpers.testbed import node_ip, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

BOB_NODE, BOB_IP = 3, node_ip(3)
NODES = 2
#: What Ray 2.60's dashboard sends where the job's proxy settings say although usage stats are
#: off (``RAY_USAGE_STATS_ENABLED=0``): cloud metadata probes, then a "usage stats disabled"
#: report (TLS to ray.io). No token is in them; nothing else may reach the proxy.
RAY_TELEMETRY = (
    "GET http://169.254.169.254/",
    "GET http://metadata.google.internal/",
    "CONNECT usage-stats.ray.io:443 ",
)
PROXY_CHECK = "GET http://proxy-check.invalid/"  # the control requests (proxied_kernel.py)
GRPC_EXEMPT = {"no_grpc_proxy": "127.0.0.1,localhost,::1"}  # dashhttp.grpc_exemptions


class BobsProxy:
    """bob's recording proxy on a compute node: every connection made to it, as JSON lines."""

    def __init__(self, port: int) -> None:
        bob = user_uid("bob")
        argv = [
            "nsenter", f"--net={NODE_NETNS.format(BOB_NODE)}",
            "setpriv", f"--reuid={bob}", f"--regid={bob}", "--init-groups",
            *recorder_argv(port),
        ]  # fmt: skip
        self.url = f"http://{BOB_IP}:{port}"
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/tmp")
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "listening"
        self.received: list[dict[str, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.received.append(json.loads(line))

    def leave(self) -> None:
        self.process.terminate()
        self.process.wait(5)
        self._reader.join(5)

    def urls(self) -> set[str]:
        """The URLs (or CONNECT targets) of the requests bob received."""
        return {seen["request"].split(" ")[1] for seen in self.received if " " in seen["request"]}

    def assert_no_token_and_nothing_but_rays_telemetry(self, token: str) -> None:
        """Nothing that reached bob carried the token, and nothing reached him but Ray's own
        telemetry (:data:`RAY_TELEMETRY`) and the control requests."""

        def line(seen: dict[str, str]) -> tuple[str, str]:
            return seen["peer"], seen["request"].split("\r\n")[0]

        with_token = [line(seen) for seen in self.received if token in str(seen)]
        assert not with_token, f"the token reached bob's proxy: {with_token}"
        expected = (*RAY_TELEMETRY, PROXY_CHECK)
        others = [line(s) for s in self.received if not line(s)[1].startswith(expected)]
        assert not others, f"reached bob's proxy (peer, request line): {others}"


class Kernel:
    """tests/helpers/proxied_kernel.py in a process whose environment names bob's proxy."""

    def __init__(self, env: dict[str, str], root: Path, setup: list[str], user: str) -> None:
        self.log_path = root / "kernel.log"  # Ray's output could fill a pipe nobody reads yet
        state_dir = root / "state"
        args = {
            "spec": {"name": "proxied", "nodes": NODES, "setup": setup},
            "prefix": runuser(user),
            "state": str(state_dir),
            "names": sorted(env),
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.proxied_kernel", json.dumps(args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=child_environment(env),
            )
        self.lines: list[dict] = []

    def next(self, key: str) -> dict:
        """The kernel's next line, which must hold ``key``."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line:
            self.lines.append(json.loads(line))
            if key in self.lines[-1]:
                return self.lines[-1]
        got = self.lines[-1] if line else "its exit"
        raise AssertionError(f"expected {key!r} from the kernel, got {got}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def down(self) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write("down\n")
        self.process.stdin.flush()
        return self.next("down")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # the kernel's down() in its finally clause
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def bobs_proxy() -> Iterator[BobsProxy]:
    proxy = BobsProxy(38000 + os.getpid() % 1000)
    yield proxy
    if proxy.process.poll() is None:
        proxy.leave()


def dashboard(cluster_id: str) -> str:
    return f"slurm-ray/dashboard/{cluster_id}/"


def open_the_dashboard_through_jupyter(server: JupyterServer, cluster_id: str, job: str) -> None:
    """The dashboard's page, its APIs, an event stream (jupyter-server-proxy's own client), a
    job's log over a websocket, and the sandboxed page route (a capability URL)."""
    page = server.get(dashboard(cluster_id))
    assert page.status_code == 200 and "<title>Ray Dashboard</title>" in page.text, page.text[:300]
    for path in ("api/cluster_status", "api/v0/nodes", f"api/jobs/{job}"):
        answer = server.get(dashboard(cluster_id) + path)
        assert answer.status_code == 200, (path, answer.text[:300])
    streamed = server.get(
        dashboard(cluster_id) + "api/version",
        headers={**server.headers(), "Accept": "text/event-stream"},
    )
    assert streamed.status_code == 200 and "ray_version" in streamed.text
    url = server.url.replace("http", "ws", 1) + dashboard(cluster_id) + f"api/jobs/{job}/logs/tail"
    ws = websocket.create_connection(
        url, header=[f"Authorization: token {server.token}"], timeout=60
    )
    try:
        text, deadline = "", time.monotonic() + 60
        while "hello-from-a-ray-job" not in text and time.monotonic() < deadline:
            text += ws.recv()
    finally:
        ws.close()
    assert "hello-from-a-ray-job" in text
    minted = server.request("POST", f"slurm-ray/dashboard-links/{cluster_id}")
    assert minted.status_code == 201, minted.text[:300]
    link = server.url.rstrip("/") + minted.json()["url"]
    sandboxed = requests.get(link + "api/cluster_status", timeout=60)
    assert sandboxed.status_code == 200, sandboxed.text[:300]


def test_no_request_with_the_token_reaches_a_proxy_named_by_the_environment(
    bobs_proxy, testbed, tmp_path
):
    proxies = proxy_environment(bobs_proxy.url)
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(proxies.items()))
    setup = [VENV_ACTIVATE, f"export {exports}"]  # as a site's module could
    kernel = Kernel(proxies, tmp_path, setup, testbed.user)
    token = ""
    try:
        started = kernel.next("id")
        token_file = Path(started["job_dir"]) / "ray_token"
        token = token_file.read_text().strip()
        # the control: a plain request from the kernel and from a task goes to bob's proxy
        assert kernel.next("proxy_check")["proxy_check"] == "HTTP 502"
        on_nodes = kernel.next("environment")["environment"]
        assert len(on_nodes) == NODES
        for host, values in on_nodes.items():
            assert values.pop("proxy_check") == "HTTP 502", host
            # Ray's processes see the job's settings, with loopback direct for gRPC only
            assert values == {**proxies, **GRPC_EXEMPT}, host
        controls = {PROXY_CHECK.split(" ")[1] + who for who in ("kernel", *on_nodes)}
        wait_for(lambda: controls <= bobs_proxy.urls(), 10, "bob's proxy to log the controls")
        job = kernel.next("job")["job"]
        assert job["status"].endswith("SUCCEEDED") and "hello-from-a-ray-job" in job["logs"], job
        adapted = kernel.next("adapt")["adapt"]
        assert adapted["cluster_status_requests"] >= 2, adapted
        assert not [line for line in adapted["scaling"] if "failed" in line], adapted
        bobs_proxy.assert_no_token_and_nothing_but_rays_telemetry(token)
        with jupyter_server(tmp_path, testbed.user, env=proxies) as server:
            open_the_dashboard_through_jupyter(server, started["id"], job["submission"])
        ended = kernel.down()
    finally:
        kernel.stop()
        bobs_proxy.leave()
    bobs_proxy.assert_no_token_and_nothing_but_rays_telemetry(token)
    assert ended["down"] in ("CANCELLED", "STOPPED")
    wait_until_nothing_left(ended["job_id"], ended["job_dir"])
