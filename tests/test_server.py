"""The clusters REST API of the server extension, with a real Jupyter server and real clusters.

``ClusterManager`` is also tested on its own (plain asyncio) for its Slurm query budget.
"""

from __future__ import annotations

import asyncio
import getpass
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.server.manager import ClusterManager

from .conftest import as_user
from .server_helpers import (
    VENV,
    VENV_PYTHON,
    JupyterServer,
    jupyter_server,
    squeue_has,
    start_cluster,
)

pytestmark = [pytest.mark.testbed]

API = "slurm-ray/api/clusters"


def finished_job(user: str) -> str:
    """The id of a real job of ``user`` that has already ended."""
    out = subprocess.run(
        [*as_user(user), "sbatch", "--parsable", "-t", "1", "-o", "/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
    ).stdout
    job_id = out.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while squeue_has(job_id) and time.monotonic() < deadline:
        time.sleep(0.3)
    return job_id


def stale_record(user: str, job_id: str, name: str = "stale") -> ClusterRecord:
    """A record that still says READY although its job ended (its kernel died, say)."""
    return ClusterRecord(
        id=f"{name}-0000",
        name=name,
        target={"kind": "local", "command_prefix": as_user(user)},
        job_dir=f"/home/{user}/.jupyter-slurm-ray/jobs/{name}-0000",
        job_id=job_id,
        state="READY",
        nodes_wanted=1,
        nodes_joined=1,
        owner_pid=999999,
    )


# -- the manager alone ------------------------------------------------------------------------
async def test_concurrent_listings_share_one_slurm_query_per_target(tmp_path, testbed):
    registry = Registry(tmp_path)
    job_id = finished_job(testbed.user)
    registry.save(stale_record(testbed.user, job_id, "one"))
    registry.save(stale_record(testbed.user, job_id, "two"))
    other = stale_record(testbed.user2, job_id, "bob")  # another target: its own query
    other.target = {"kind": "local", "command_prefix": as_user(testbed.user2)}
    registry.save(other)
    manager = ClusterManager(registry, refresh_interval=2.0)
    listings = await asyncio.gather(*(manager.list() for _ in range(20)))
    assert manager.slurm_queries == 2  # one per target, for 20 concurrent callers
    assert {c["state"] for c in listings[0]["clusters"]} == {"STOPPED"}
    await manager.list()
    assert manager.slurm_queries == 2  # still fresh
    await asyncio.sleep(2.1)
    await manager.list()
    assert manager.slurm_queries == 4
    await manager.close()


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
        f'setup = ["source {VENV}/bin/activate"]\n'
        'object_store_memory = "200M"\n'
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


def test_the_api_needs_jupyter_auth(server):
    assert server.get(API, headers={}).status_code == 403
    assert server.request("DELETE", f"{API}/nosuch-0000", headers={}).status_code == 403


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


def test_get_unknown_is_a_json_404(server):
    response = server.get(f"{API}/nosuch-0000")
    assert response.status_code == 404
    assert "nosuch-0000" in response.json()["message"]
    assert server.get(f"{API}/..%2f..%2fetc").status_code == 404


def test_bad_query_arguments_name_the_field(server, cluster):
    response = server.get(f"{API}/{cluster.id}?tail=lots")
    assert response.status_code == 400
    assert response.json()["field"] == "tail" and "tail" in response.json()["message"]


def test_delete_stops_the_cluster(server, cluster):
    assert squeue_has(cluster.job_id)
    response = server.request("DELETE", f"{API}/{cluster.id}")
    assert response.status_code == 200, response.text
    assert response.json()["state"] in ("STOPPED", "CANCELLED")
    assert not squeue_has(cluster.job_id)
    assert cluster_view(server, cluster.id)["state"] in ("STOPPED", "CANCELLED")
    gone = server.get(f"slurm-ray/dashboard/{cluster.id}/")
    assert gone.status_code == 503 and "STOPPED" in gone.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"profile": "tiny", "nodes": 0}, "nodes"),
        ({"profile": "tiny", "time": "25:99"}, "time"),
        ({"profile": "nosuch"}, "profile"),
        ({"profile": "tiny", "nodez": 2}, "nodez"),
        ({"profile": 3}, "profile"),
        ({"nodes": 1}, "time"),
        ([1, 2], "body"),
    ],
)
def test_post_refuses_bad_input_naming_the_field(server, body, field, testbed):
    before = _jobs_of(testbed.user)
    response = server.request("POST", API, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field
    assert field in response.json()["message"]
    assert _jobs_of(testbed.user) == before  # nothing submitted


def test_post_that_slurm_refuses_is_a_400_with_slurms_words(server, testbed):
    before = _jobs_of(testbed.user)
    response = server.request("POST", API, json={"profile": "tiny", "partition": "nosuch"})
    assert response.status_code == 400, response.text
    assert "invalid partition" in response.json()["message"].lower()
    assert _jobs_of(testbed.user) == before


def test_post_refuses_a_body_that_is_not_json(server):
    response = server.request("POST", API, data=b"{nope", headers=server.headers())
    assert response.status_code == 400 and response.json()["field"] == "body"


@pytest.mark.ray
def test_post_creates_a_server_owned_cluster_from_a_profile(server, testbed):
    response = server.request("POST", API, json={"profile": "tiny", "name": "posted"})
    assert response.status_code == 201, response.text
    created = response.json()
    try:
        assert created["name"] == "posted" and created["server_owned"] is True
        assert created["owner_pid"] == server.proc.pid
        assert created["state"] in ("PENDING", "STARTING")
        assert squeue_has(created["job_id"])
        deadline = time.monotonic() + 90
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
    assert not squeue_has(created["job_id"])


def _jobs_of(user: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-u", user, "-o", "%i"], capture_output=True, text=True, check=False
    ).stdout
