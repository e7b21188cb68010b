"""The clusters REST API of the server extension, with a real Jupyter server and real clusters.

``ClusterManager`` alone (its Slurm query budget, housekeeping) and the handlers' answers that
need no real Slurm (auth, 404, refused input, unreadable records) are in ``tests/fast``.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import cluster_spec
from .helpers.faults import record_figure
from .helpers.jobs import pending_or_running
from .helpers.kernel import start_kernel
from .helpers.paths import VENV_ACTIVATE, VENV_PYTHON
from .helpers.server import JupyterServer, jupyter_server, start_cluster
from .helpers.testbed import ENFORCED_MEMORY, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed]

API = "slurm-ray/api/clusters"


def finished_job(user: str) -> str:
    """The id of a real job of ``user`` that has already ended."""
    out = subprocess.run(
        [*runuser(user), "sbatch", "--parsable", "-t", "1", "-o", "/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
    ).stdout
    job_id = out.strip().split(";")[0]
    # it may wait for a free CPU first: the other tests' clusters share the partition
    wait_for(lambda: not pending_or_running(job_id), 180, f"job {job_id} to end", step=0.3)
    return job_id


def stale_record(user: str, job_id: str, name: str = "stale") -> ClusterRecord:
    """A record that still says READY although its job ended (its kernel died, say)."""
    return ClusterRecord(
        id=f"{name}-0000",
        name=name,
        target=f"local (runuser -u {user} --)",
        job_dir=f"/home/{user}/.jupyter-slurm-ray/jobs/{name}-0000",
        job_id=job_id,
        state="READY",
        nodes_wanted=1,
        nodes_joined=1,
        owner_pid=999999,
    )


# -- the REST API -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("server")
    (root / "profiles.toml").write_text(
        "[profiles.tiny]\n"
        'description = "one node, one CPU"\n'
        "nodes = 1\n"
        "cpus_per_node = 1\n"
        'time = "10"\n'
        f'python = "{VENV_PYTHON}"\n'
        f'setup = ["{VENV_ACTIVATE}"]\n'
        'object_store_memory = "200M"\n'
        "start_timeout = 180\n"
        # where the site enforces memory, what a head needs (its default would be refused)
        + (f'mem_per_node = "{ENFORCED_MEMORY}"\n' if ENFORCED_MEMORY else "")
    )
    return root


@pytest.fixture(scope="module")
def server(root, testbed) -> Iterator[JupyterServer]:
    with jupyter_server(root, testbed.user) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(root, testbed):
    cluster = start_cluster(root / "state", testbed.user, "apitest")
    yield cluster
    cluster.down()


def cluster_view(server: JupyterServer, cluster_id: str) -> dict:
    listing = server.get(API).json()
    return next(c for c in listing["clusters"] if c["id"] == cluster_id)


def test_list_shows_clusters_reconciled_with_slurm(server, cluster, root, testbed):
    Registry(root / "state").save(stale_record(testbed.user, finished_job(testbed.user)))
    time.sleep(3.1)  # past the listing's cache
    response = server.get(API)
    assert response.status_code == 200
    clusters = {c["id"]: c for c in response.json()["clusters"]}
    live = clusters[cluster.id]
    assert live["state"] == "READY" and live["slurm_state"] == "RUNNING"
    assert live["nodes_joined"] == live["nodes_wanted"] == 1
    assert 0 < live["time_left"] <= 600 and live["owner"] == getpass.getuser()
    assert live["dashboard_url"] == f"/slurm-ray/dashboard/{cluster.id}/"
    assert live["attach_command"] == "%slurm_ray attach apitest"
    stale = clusters["stale-0000"]
    assert stale["state"] == "STOPPED" and stale["slurm_state"] == "COMPLETED"


def test_listing_asks_slurm_at_most_once_per_few_seconds(server, cluster):
    first = server.get(API).json()["slurm_queries"]
    counts = [server.get(API).json()["slurm_queries"] for _ in range(15)]
    assert max(counts) - first <= 1
    time.sleep(3.1)
    assert server.get(API).json()["slurm_queries"] > max(counts)


def test_get_one_has_recent_events_and_a_log_tail(server, cluster):
    response = server.get(f"{API}/{cluster.id}?events=5&tail=20")
    assert response.status_code == 200
    view = response.json()
    assert view["id"] == cluster.id and view["state"] == "READY"
    events = [e["event"] for e in view["events"]]
    assert 0 < len(events) <= 5 and "ready" in events
    assert "==> slurm-" in view["log_tail"]


def test_delete_stops_the_cluster(server, cluster):
    assert pending_or_running(cluster.job_id)
    response = server.request("DELETE", f"{API}/{cluster.id}")
    assert response.status_code == 200, response.text
    assert response.json()["state"] in ("STOPPED", "CANCELLED")
    assert not pending_or_running(cluster.job_id)
    ended = cluster_view(server, cluster.id)["state"]
    assert ended in ("STOPPED", "CANCELLED")
    gone = server.get(f"slurm-ray/dashboard/{cluster.id}/")
    assert gone.status_code == 503 and f"is {ended}" in gone.text  # as the view says


@pytest.mark.exclusive  # compares the user's whole queue
def test_post_that_slurm_refuses_is_a_400_with_slurms_words(server, testbed):
    before = _jobs_of(testbed.user)
    response = server.request("POST", API, json={"profile": "tiny", "partition": "nosuch"})
    assert response.status_code == 400, response.text
    assert "invalid partition" in response.json()["message"].lower()
    assert _jobs_of(testbed.user) == before


@pytest.mark.ray
def test_post_creates_a_server_owned_cluster_from_a_profile(server, testbed):
    response = server.request("POST", API, json={"profile": "tiny", "name": "posted"})
    assert response.status_code == 201, response.text
    created = response.json()
    try:
        assert created["name"] == "posted" and created["server_owned"] is True
        assert created["owner_pid"] == server.proc.pid
        assert created["state"] in ("PENDING", "STARTING")
        assert pending_or_running(created["job_id"])
        deadline = time.monotonic() + 180 + 30  # the profile's start_timeout, then it fails
        state = created["state"]
        while state != "READY" and time.monotonic() < deadline:
            time.sleep(1)
            state = server.get(f"{API}/{created['id']}").json()["state"]
        assert state == "READY"
        status = server.get(f"slurm-ray/dashboard/{created['id']}/api/cluster_status")
        assert status.status_code == 200
    finally:
        stopped = server.request("DELETE", f"{API}/{created['id']}")
    assert stopped.status_code == 200 and stopped.json()["state"] == "STOPPED"
    assert not pending_or_running(created["job_id"])


def _jobs_of(user: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-u", user, "-o", "%i"], capture_output=True, text=True, check=False
    ).stdout


# -- faults and hostile input -------------------------------------------------------------------
def test_the_server_cancels_a_cluster_whose_kernel_died_without_waiting(server, root, testbed):
    """The kernel's cluster has the default idle timeout (300 s): the server does not wait."""
    kernel = start_kernel(str(root / "state"), runuser(testbed.user), extra_sbatch=["--hold"])
    assert pending_or_running(kernel.job_id)
    kernel.kill()
    killed = time.monotonic()
    deadline = killed + 60
    while pending_or_running(kernel.job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    cancelled_after = time.monotonic() - killed
    assert not pending_or_running(kernel.job_id) and cancelled_after < 30
    assert "its owner (pid" in server.log() and kernel.job_id in server.log()
    wait_for(lambda: cluster_view(server, kernel.id)["state"] != "PENDING", 30, "the listing")
    assert cluster_view(server, kernel.id)["state"] in ("CANCELLED", "STOPPED")
    record_figure(
        "kernel SIGKILLed while PENDING, Jupyter server running",
        cancelled_by_server_after_s=round(cancelled_after, 1),
    )


def test_hostile_and_broken_records_run_nothing_and_the_api_keeps_working(server, root, tmp_path):
    canary = tmp_path / "touched"
    clusters = root / "state" / "clusters"
    clusters.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the registry makes it
    hostile = {
        "id": "evil-0001",
        "name": "evil",
        "target": {"kind": "local", "command_prefix": ["touch", str(canary)]},
        "job_dir": "/tmp",
        "job_id": "1",
        "state": "READY",
    }
    planted = {
        "evil-0001": json.dumps(hostile),
        "trunc-0001": '{"id": "trunc-0001", "name": "tr',
        "types-0001": json.dumps({**hostile, "id": "types-0001", "nodes_wanted": "many"}),
    }
    try:
        for cluster_id, text in planted.items():
            path = clusters / f"{cluster_id}.json"
            path.write_text(text)
            path.chmod(0o600)
        time.sleep(3.1)  # past the listing's cache
        response = server.get(API)
        assert response.status_code == 200, response.text
        views = {c["id"]: c for c in response.json()["clusters"]}
        assert views["evil-0001"]["reachable"] is False and views["evil-0001"]["state"] == "READY"
        assert (
            views["trunc-0001"]["unreadable"] and "not valid JSON" in views["trunc-0001"]["error"]
        )
        assert views["types-0001"]["unreadable"] and "nodes_wanted" in views["types-0001"]["error"]
        assert server.get(f"{API}/trunc-0001").status_code == 200
        assert server.get("slurm-ray/dashboard/evil-0001/").status_code == 503
        forgotten = server.request("DELETE", f"{API}/trunc-0001?forget=true")
        assert forgotten.status_code == 200 and not (clusters / "trunc-0001.json").exists()
        time.sleep(1)
        assert not canary.exists()
    finally:
        for cluster_id in planted:
            (clusters / f"{cluster_id}.json").unlink(missing_ok=True)


def log_tail(server, cluster_id: str) -> str:
    response = server.get(f"{API}/{cluster_id}")
    assert response.status_code == 200, response.text
    return response.json()["log_tail"] or ""


@pytest.mark.ray
def test_a_log_that_is_not_utf8_and_a_cancel_keep_the_api_answering(server, root, testbed):
    cluster = SlurmRayCluster(
        cluster_spec(name="latin1").replace(setup=["printf 'caf\\351 \\377\\n'", "sleep 600"]),
        LocalTransport(runuser(testbed.user)),
        registry=Registry(root / "state"),
    )
    cluster.up(wait=False)
    try:
        wait_for(lambda: cluster.state is State.STARTING, 60, "the job to run")
        # the setup's bytes written before the cancel (a loaded machine ran scancel first)
        wait_for(lambda: "\ufffd" in log_tail(server, cluster.id), 60, "the setup's output")
        subprocess.run(["scancel", cluster.job_id], check=True)
        wait_for(lambda: cluster.state.is_final, 60, "the cancel")
        assert cluster.state is State.CANCELLED
        response = server.get(f"{API}/{cluster.id}")
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "CANCELLED" and "\ufffd" in response.json()["log_tail"]
    finally:
        cluster.down()
