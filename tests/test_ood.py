"""Open OnDemand's shape, for real: a Jupyter server started as a Slurm job on a compute node
with OOD's base URL ``/node/<host>/<port>/`` (as OOD's Jupyter app configures it: any origin,
no XSRF check, its own port), reached through Apache httpd doing what OOD's ``/node`` rule
does (``scripts/ood``: mod_proxy, mod_proxy_http, mod_proxy_wstunnel, the path unchanged).

Through it: JupyterLab with this package's labextension, the clusters API the sidebar uses, a
cluster's sandboxed dashboard page, and Ray's Jobs CLI, whose log tail is a websocket.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from .helpers.clusters import wait_until_nothing_left
from .helpers.faults import record_figure
from .helpers.hub import (
    OOD_PORT,
    forget_record,
    jobs_cli,
    login_node_address,
    record_of,
    service,
    user_venv,
)
from .helpers.jobs import in_queue
from .helpers.testbed import runuser
from .helpers.waiting import wait_for

# One group with tests_browser/test_hub.py (the same hub and Apache on the login node) and
# with the tests where bob squats ports next to any new listener of alice's: the two times these
# ran beside the parallel tests (as their own group) the hub lost alice's server and Apache
# stopped answering mid-module, and a port taken from under them is the one cause left.
pytestmark = [
    pytest.mark.testbed,
    pytest.mark.ray,
    pytest.mark.host_stack,  # Apache and the hub's stack: the host's flavour only
    pytest.mark.xdist_group("bob-squats-ports"),
]

API = "slurm-ray/api/clusters"
IDLE = 20.0

#: What OOD's Jupyter app does in its job: a free port, the base URL naming this node and it,
#: Jupyter on every interface. The token comes in the environment (OOD uses a password form).
JOB_SCRIPT = """#!/bin/bash
#SBATCH --job-name=ood-jupyter --nodes=1 --cpus-per-task=1 --mem=1G --time=0:30:00
#SBATCH --output=/dev/null
set -euo pipefail
host=$(hostname)
port=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("", 0))
print(s.getsockname()[1])')
echo "$host $port" >"$HOME/.jsr-ood-$SLURM_JOB_ID"
exec "$VENV/bin/jupyter" lab --no-browser --ip='*' --port="$port" --port-retries=0 \\
  --ServerApp.base_url="/node/$host/$port/" --ServerApp.allow_origin='*' \\
  --ServerApp.disable_check_xsrf=True --IdentityProvider.token="$JSR_OOD_TOKEN" \\
  --ServerApp.root_dir="$HOME"
"""


@dataclass
class OodJupyter:
    """The Jupyter server of an OOD-like job, seen through Apache."""

    job_id: str
    user: str
    base: str  # http://<login>:8080/node/<host>/<port>/
    token: str

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 120)
        kwargs.setdefault("allow_redirects", False)
        headers = {"Authorization": f"token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, self.base + path.lstrip("/"), headers=headers, **kwargs)


@pytest.fixture(scope="module")
def apache() -> Iterator[None]:
    with service("ood"):
        yield


@pytest.fixture(scope="module")
def jupyter(apache, testbed) -> Iterator[OodJupyter]:
    venv = user_venv()
    token = secrets.token_hex(24)
    environment = [
        "ALL",
        f"VENV={venv}",
        f"JSR_OOD_TOKEN={token}",
        "JUPYTER_SLURM_RAY_CPUS_PER_NODE=1",
        "JUPYTER_SLURM_RAY_OBJECT_STORE_MEMORY=200M",
    ]
    submitted = subprocess.run(
        [*runuser(testbed.user), "sbatch", "--parsable", f"--export={','.join(environment)}"],
        input=JOB_SCRIPT,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    job_id = submitted.stdout.strip().split(";")[0]
    where = f"/home/{testbed.user}/.jsr-ood-{job_id}"
    try:
        host, port = wait_for(lambda: _read(where), 60, "the Jupyter job to choose its port")
        server = OodJupyter(
            job_id, testbed.user, f"http://{login_node_address()}:{OOD_PORT}/node/{host}/{port}/",
            token,
        )  # fmt: skip

        def answers() -> bool:
            try:
                return server.call("GET", "api/status", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(answers, 90, "Jupyter to answer through Apache", step=1)
        yield server
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)
        subprocess.run(["rm", "-f", where], check=False)


def _read(path: str) -> list[str] | None:
    try:
        with open(path) as f:
            parts = f.read().split()
    except OSError:
        return None
    return parts if len(parts) == 2 else None


@pytest.fixture(scope="module")
def cluster(jupyter: OodJupyter) -> Iterator[dict[str, Any]]:
    created = jupyter.call(
        "POST", API, json={"name": "oodtest", "nodes": 1, "time": "0:20:00", "owner_timeout": IDLE}
    )
    assert created.status_code == 201, (created.status_code, created.text[:2000])
    view = created.json()

    def ready() -> dict[str, Any] | None:
        now = jupyter.call("GET", f"{API}/{view['id']}").json()
        if now.get("final"):
            raise AssertionError(f"the cluster ended: {now}")
        return now if now["state"] in ("READY", "CONNECTED") else None

    try:
        yield wait_for(ready, 240, "the cluster to be READY", step=1)
    finally:
        job_dir = record_of(jupyter.user, view["id"])["job_dir"]
        jupyter.call("DELETE", f"{API}/{view['id']}")
        wait_until_nothing_left(view["job_id"], job_dir, timeout=60)
        forget_record(jupyter.user, view["id"])


def test_jupyterlab_and_the_clusters_api_answer_under_oods_node_url(jupyter):
    lab = jupyter.call("GET", "lab")
    assert lab.status_code == 200, lab.status_code
    config = json.loads(
        re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', lab.text, re.S).group(1)
    )
    prefix = jupyter.base.split(":8080", 1)[1]
    assert config["baseUrl"] == prefix  # /node/<host>/<port>/
    assert "jupyter-slurm-ray" in {e["name"] for e in config["federated_extensions"]}
    listing = jupyter.call("GET", API)
    assert listing.status_code == 200 and "clusters" in listing.json()


def test_the_sandboxed_dashboard_page_comes_through_apache(jupyter, cluster):
    link = jupyter.call("POST", f"slurm-ray/dashboard-links/{cluster['id']}")
    assert link.status_code == 201, link.text[:500]
    url = link.json()["url"]
    prefix = jupyter.base.split(":8080", 1)[1]
    assert url.startswith(f"{prefix}slurm-ray/dashboard/{cluster['id']}/~"), url
    page = requests.get(
        jupyter.base + url.removeprefix(prefix), headers={"Sec-Fetch-Dest": "iframe"}, timeout=60
    )
    assert page.status_code == 200 and "<title>Ray Dashboard</title>" in page.text
    assert page.headers["Content-Security-Policy"].startswith("sandbox")


TICKS = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(1)"


def test_rays_jobs_cli_follows_the_logs_over_a_websocket_through_apache(jupyter, cluster):
    """``ray job submit`` without ``--no-wait`` tails the job's logs over a websocket: through
    mod_proxy_wstunnel, Jupyter and this package's proxy to the head."""
    address = jupyter.base + f"slurm-ray/dashboard/{cluster['id']}"
    headers = json.dumps({"Authorization": f"token {jupyter.token}"})
    started = time.monotonic()
    done = jobs_cli(
        "submit", "--address", address, "--headers", headers, "--",
        "python", "-c", TICKS,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert all(f"tick {i}" in done.stdout for i in range(3)), done.stdout[-2000:]
    assert re.search(r"Job 'raysubmit_\w+' succeeded", done.stdout), done.stdout[-2000:]
    access = Path("/var/log/jsr-testbed/ood-access.log").read_text()
    tail = rf"GET /node/\S+/slurm-ray/dashboard/{cluster['id']}/api/jobs/\S+/logs/tail"
    assert re.search(tail, access), "the log tail did not go through Apache"
    record_figure("Ray Jobs CLI through Apache /node", submit_and_tail_s=time.monotonic() - started)
    assert in_queue(cluster["job_id"])
