"""Scaling a real cluster with worker jobs (issue 9): out and in under a running workload, the
head cancelled from outside, bad input. Real sbatch, real Ray, as alice, on the testbed.

The cluster's jobs take a whole node each (cpus_per_node=2), so that every Ray node has its
own address; a node another test holds is waited for, not failed on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import cluster_spec, last_json_line, processes_of
from .helpers.jobs import in_queue
from .helpers.testbed import runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

QUEUE_WAIT = 300  # other tests may hold nodes: their jobs end within their walltime

WORKLOAD = """
import json, socket, sys, time, ray
from jupyter_slurm_ray.connect import connect_ray_client
connect_ray_client(sys.argv[1], sys.argv[2], timeout=30)

@ray.remote(num_cpus=1)
def work(i):
    time.sleep(4)
    return i, socket.gethostname()

refs = [work.remote(i) for i in range(24)]
print("submitted", flush=True)
done = ray.get(refs)
print(json.dumps({"done": sorted(i for i, _ in done), "hosts": sorted({h for _, h in done})}))
"""


def processes_of_job(job_dir: str, job_id: str) -> list[int]:
    """The cluster's processes started by one Slurm job (they inherit its SLURM_JOB_ID)."""
    found = []
    for pid in processes_of(job_dir):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ:
            found.append(pid)
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    registry = Registry(tmp_path_factory.mktemp("state"))
    spec = cluster_spec(cpus_per_node=2, idle_timeout=60)
    cluster = SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)
    cluster.up(connect=False, queue_timeout=QUEUE_WAIT)
    yield cluster
    cluster.down()
    leftover = [job_id for job_id in cluster.workers.jobs if in_queue(job_id)]
    subprocess.run(["scancel", *leftover], check=False, capture_output=True)


def alive(cluster: SlurmRayCluster) -> int:
    return cluster.refresh().nodes_joined


def test_bad_input_is_one_line_and_changes_nothing(cluster):
    before = (cluster.status.nodes_wanted, dict(cluster.workers.jobs))
    for bad in (-1, 1.5, "three", True, 0):
        with pytest.raises(SpecError) as caught:
            cluster.scale(bad)
        message = str(caught.value)
        assert "nodes" in message and "\n" not in message
    assert (cluster.status.nodes_wanted, dict(cluster.workers.jobs)) == before


def test_scale_1_3_1_under_a_workload_finishes_every_task(cluster):
    token = cluster.registry.store_token(
        cluster.id, Path(f"{cluster.job_dir}/ray_token").read_text().strip()
    )
    info = cluster.connection_info()
    address = f"ray://{info.head_ip}:{info.client_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    workload = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WORKLOAD), address, str(token)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert workload.stdout is not None
        assert workload.stdout.readline().strip() == "submitted"
        cluster.scale(3)
        assert cluster.status.nodes_wanted == 3
        assert len(cluster.workers.active()) == 2
        wait_for(lambda: alive(cluster) == 3, QUEUE_WAIT, "3 nodes alive")
        retired = [job.job_id for job in cluster.workers.active()]
        cluster.scale(1)
        assert cluster.status.nodes_wanted == 1
        out, err = workload.communicate(timeout=300)
    finally:
        if workload.poll() is None:
            workload.kill()
    result = last_json_line(out)
    assert result["done"] == list(range(24)), err[-2000:]
    assert len(result["hosts"]) >= 2  # the worker jobs' nodes did work
    for job_id in retired:
        wait_for(lambda job_id=job_id: not in_queue(job_id), 60, f"worker job {job_id} to end")
        wait_for(
            lambda job_id=job_id: not processes_of_job(cluster.job_dir, job_id),
            30,
            f"the Ray processes of worker job {job_id} to end",
        )
    wait_for(lambda: alive(cluster) == 1, 30, "1 node alive")
    assert cluster.state is State.READY and cluster.status.nodes_lost == ()
    ends = {e["worker_job"]: e for e in cluster.events if e.get("event") == "worker_stopped"}
    drains = {e["worker_job"]: e for e in cluster.events if e.get("event") == "worker_draining"}
    for job_id in retired:  # drained through Ray, not killed by the drain's timeout
        assert drains[job_id]["accepted"] is True
        assert ends[job_id]["reason"] == "drained: scaled in"


def test_head_cancelled_from_outside_ends_every_worker_job(cluster):
    cluster.scale(2)
    wait_for(lambda: alive(cluster) == 2, QUEUE_WAIT, "2 nodes alive")
    workers = [job.job_id for job in cluster.workers.active()]
    assert len(workers) == 1
    subprocess.run(["scancel", cluster.job_id], check=True)
    for job_id in workers:
        wait_for(lambda job_id=job_id: not in_queue(job_id), 90, f"worker job {job_id} to end")
        wait_for(
            lambda job_id=job_id: not processes_of_job(cluster.job_dir, job_id),
            30,
            f"the Ray processes of worker job {job_id} to end",
        )
    wait_for(lambda: cluster.refresh().state.is_final, 60, "the cluster to end")
    assert cluster.state is State.CANCELLED
