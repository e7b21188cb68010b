"""Ray's own Jobs tools find a cluster by its name: ``slurm_ray://NAME`` (client/jobaddress.py);
and ``jupyter slurm-ray dashboard NAME`` opens its dashboard from a terminal.

A cluster is started (not connected: nothing of Ray in this process), then Ray's ``ray job``
command line is run from a terminal of the login node as a user would, with the site's
variables only: no token, no CA, no port given to it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap.jsr_wire import TOKEN_FILE
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import cluster_spec, wait_until_nothing_left
from .helpers.paths import VENV_PYTHON
from .helpers.site import configured_site
from .helpers.testbed import USER, runuser

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

RAY = str(Path(VENV_PYTHON).parent / "ray")


@pytest.fixture(scope="module")
def site(tmp_path_factory, testbed) -> Iterator[dict[str, str]]:
    with configured_site(tmp_path_factory.mktemp("site")) as environment:
        yield environment


@pytest.fixture(scope="module")
def cluster(site) -> Iterator[SlurmRayCluster]:
    registry = Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"])
    name = "jobs" + uuid.uuid4().hex[:6]
    cluster = SlurmRayCluster(
        cluster_spec(name=name), LocalTransport(runuser(USER)), registry=registry
    )
    cluster.up(connect=False)
    yield cluster
    cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


def ray_job(*argv: str, **environment: str) -> subprocess.CompletedProcess:
    """``ray job ARGV`` in a terminal of the login node, with the site's variables."""
    ours = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in ours} | environment
    return subprocess.run(
        [RAY, "job", *argv], capture_output=True, text=True, env=env, timeout=300, cwd="/"
    )


def token_of(cluster: SlurmRayCluster) -> str:
    return Path(cluster.job_dir, TOKEN_FILE).read_text().strip()


def test_ray_job_submit_by_name_runs_a_job_and_its_logs_come_back(cluster):
    address = f"slurm_ray://{cluster.spec.name}"
    code = "import socket; print('hello from', socket.gethostname())"
    done = ray_job("submit", "--address", address, "--", "python", "-c", code)
    assert done.returncode == 0, done.stderr
    assert re.search(r"hello from node\d", done.stdout), done.stdout
    assert "succeeded" in done.stdout
    submission = re.search(r"raysubmit_\w+", done.stdout)
    assert submission is not None, done.stdout
    # RAY_ADDRESS names it as well, for every ray job command; a shell where Ray's token auth
    # is on with another cluster's token (Ray's client would send that one) changes nothing
    other = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a-token-of-another-cluster"}
    listed = ray_job("list", RAY_ADDRESS=address, **other)
    assert listed.returncode == 0 and submission.group(0) in listed.stdout, listed.stderr
    logs = ray_job("logs", submission.group(0), RAY_ADDRESS=address)
    assert re.search(r"hello from node\d", logs.stdout), logs.stderr
    # the token went in a header, to this process's own listener: never printed, never a URL
    token = token_of(cluster)
    for output in (done, listed, logs):
        assert token not in output.stdout + output.stderr


def test_an_unknown_name_is_one_clear_error(cluster):
    done = ray_job("list", "--address", "slurm_ray://no-such-cluster")
    assert done.returncode != 0
    assert "no cluster of that name, id or job id in your registry" in done.stderr


DASHBOARD_URL = re.compile(r"Ray dashboard of \S+: (http://127\.0\.0\.1:(\d+)/\S+/)")


def test_the_dashboard_command_serves_it_on_loopback_behind_an_unguessable_link(cluster):
    """``jupyter slurm-ray dashboard NAME`` from a terminal: a URL on 127.0.0.1 that works
    while the command runs, with the dashboard's pages and API behind it; the same server
    without the link's segment answers nothing of the cluster, and Ctrl-C ends it all."""
    command = [str(Path(VENV_PYTHON).parent / "jupyter-slurm-ray"), "dashboard", cluster.spec.name]
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        found = DASHBOARD_URL.search(first)
        assert found, first + (server.stderr.read() if server.poll() is not None else "")
        url, port = found.group(1), int(found.group(2))
        status, body = fetch(url + "api/version")
        assert status == 200 and '"ray_version"' in body, (status, body[:300])
        status, page = fetch(url)
        assert status == 200 and "<html" in page.lower(), (status, page[:300])
        guess = f"http://127.0.0.1:{port}/slurm-ray/dashboard/{cluster.id}/api/version"
        status, body = fetch(guess)
        assert status in (302, 403) and '"ray_version"' not in body, (status, body[:300])
        assert fetch(url.replace("/~", "/~x") + "api/version")[0] == 404  # not a capability
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err[-2000:]
    assert token_of(cluster) not in first + out + err
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens there any more
    with socket.socket() as taken:  # a port someone else listens on: one line that says so
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = subprocess.run(
            [*command, "--port", str(busy)], capture_output=True, text=True, timeout=60, cwd="/"
        )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"error: --port: {busy} is taken on 127.0.0.1" in done.stderr, done.stderr[-2000:]


def fetch(url: str) -> tuple[int, str]:
    """GET without redirects or proxies: the status and the body."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    try:
        with opener.open(url, timeout=60) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
