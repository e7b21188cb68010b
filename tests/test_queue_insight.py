"""A pending cluster says why it waits (issue 11, item 5), against the real testbed: Slurm's
reason in plain words with what to do, the start Slurm estimates (``squeue --start``) and what
it waits for, in the kernel's status and in the REST view the sidebar shows."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.server.manager import ClusterManager
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.targets import Transports
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.reprs import cluster_queue

from .helpers.clusters import cluster_spec, wait_until_nothing_left
from .helpers.jobs import queue_state
from .helpers.testbed import SOLO, USER, runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.solo]  # bob holds every solo node

QUEUE_WAIT = 120.0  # the previous solo test's jobs may still hold a node for a moment


@pytest.fixture
def every_node_held(solo_nodes) -> Iterator[str]:
    """bob's job on every node of the solo partition, for five minutes at most."""
    done = subprocess.run(
        [*runuser("bob"), "sbatch", "--parsable", "-p", SOLO, f"-N{len(solo_nodes)}",
         "--exclusive", "-t", "5",
         "-J", "queue-blocker", "-D", "/tmp", "-o", "/dev/null", "--wrap", "sleep 300"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = done.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: queue_state(job_id) == "RUNNING", QUEUE_WAIT, "bob's job to start")
        yield job_id
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)


def slurms_estimate(job_id: str) -> str:
    """``squeue --start``'s estimated start of a pending job (N/A while it has none)."""
    argv = [*runuser(USER), "squeue", "--start", "-h", "-j", job_id, "-o", "%S"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _no_new_clusters(*args, **kwargs):
    raise AssertionError("this test starts no cluster through the server")


def test_a_pending_cluster_says_why_when_and_what_for(tmp_path, every_node_held):
    registry = Registry(tmp_path / "state")
    cluster = SlurmRayCluster(
        cluster_spec(nodes=2, partition=SOLO), LocalTransport(runuser(USER)), registry=registry
    )
    cluster.up(wait=False)
    try:
        wait_for(
            lambda: cluster.refresh().state is State.PENDING and cluster.status.reason,
            60,
            "the cluster PENDING with Slurm's reason",
        )
        # Slurm's backfill estimates a start within its interval; the blocker ends in 5 min
        wait_for(lambda: cluster.refresh().estimated_start, 90, "Slurm's estimated start")
        status = cluster.status
        assert status.reason in ("Resources", "Priority")
        estimate = datetime.fromisoformat(slurms_estimate(cluster.job_id))
        assert abs((status.estimated_start - estimate).total_seconds()) <= 60
        queue = cluster_queue(cluster)
        assert queue is not None and queue.hint == f"waiting for 2 nodes in partition {SOLO}"
        time.sleep(6)  # past the watcher's next ticks: they keep the newer answer
        assert cluster.status.estimated_start == status.estimated_start
        shown = cluster._repr_mimebundle_()["text/plain"]
        assert queue.meaning in shown and queue.action in shown
        assert f"est. start {status.estimated_start:%Y-%m-%d %H:%M}" in shown, shown
        server = ClusterManager(
            registry, Transports(lambda: cluster.transport), resolve_spec=_no_new_clusters
        )
        view = run_sync(server.get(cluster.id))  # what GET slurm-ray/api/clusters/<id> sends
        assert view["state"] == "PENDING" and view["reason"] == status.reason
        assert view["estimated_start"] == status.estimated_start.isoformat()
        assert view["queue"]["meaning"] == queue.meaning and view["queue"]["hint"] == queue.hint
    finally:
        cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
