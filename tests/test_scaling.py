"""Scaling a real cluster with worker jobs (issue 9): out and in under a running workload, the
head cancelled from outside, bad input. Real sbatch, real Ray, as alice, on the testbed.

The cluster's jobs take a whole node each (cpus_per_node=2), so that every Ray node has its
own address; a node another test holds is waited for, not failed on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import client_tls_environment, cluster_spec, last_json_line, processes_of
from .helpers.jobs import in_queue
from .helpers.paths import NODES_SEE
from .helpers.testbed import SOLO, runuser
from .helpers.waiting import wait_for

# solo: scaled to a head and 2 worker jobs of whole nodes, every node of the solo partition
pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.solo]

QUEUE_WAIT = 300  # the previous solo test's jobs may still be ending

# Every task tells where it runs (a file beside the flag) and waits for the flag file (one
# machine: the nodes share /tmp), so that tasks still run on the worker nodes as they drain.
WORKLOAD = """
import json, os, socket, sys, time, ray
from jupyter_slurm_ray.client.connect import connect_ray_client
connect_ray_client(sys.argv[1], sys.argv[2], timeout=30)

@ray.remote(num_cpus=1)
def work(i, flag):
    open(os.path.join(os.path.dirname(flag), f"{socket.gethostname()}-{i}"), "w").close()
    while not os.path.exists(flag):
        time.sleep(0.2)
    time.sleep(1)
    return i, socket.gethostname()

refs = [work.remote(i, sys.argv[3]) for i in range(24)]
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
def cluster(tmp_path_factory, solo_nodes):
    registry = Registry(tmp_path_factory.mktemp("state"))
    spec = cluster_spec(partition=SOLO, cpus_per_node=2, owner_timeout=60)
    cluster = SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)
    cluster.up(connect=False, queue_timeout=QUEUE_WAIT)
    yield cluster
    cluster.down()
    leftover = [job_id for job_id in cluster.workers.jobs if in_queue(job_id)]
    subprocess.run(["scancel", *leftover], check=False, capture_output=True)


def alive(cluster: SlurmRayCluster) -> int:
    return cluster.refresh().nodes_joined


def hosts_running(directory: Path) -> set[str]:
    return {path.name.rsplit("-", 1)[0] for path in directory.iterdir() if path.name != "go"}


def events(cluster: SlurmRayCluster, kind: str) -> list[dict]:
    cluster.refresh()  # reads the new events too
    return [e for e in cluster.events if e.get("event") == kind]


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
    env.update(client_tls_environment(cluster.job_dir))
    flag = Path(tempfile.mkdtemp(prefix="jsr-scale-", dir=NODES_SEE)) / "go"
    flag.parent.chmod(0o777)  # the tasks run as the test user
    workload = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WORKLOAD), address, str(token), str(flag)],
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
        wait_for(lambda: len(hosts_running(flag.parent)) == 3, 60, "tasks on all 3 nodes")
        retired = [job.job_id for job in cluster.workers.active()]
        with ThreadPoolExecutor(1) as pool:  # scale(1) returns once the drained jobs ended
            scaling_in = pool.submit(cluster.scale, 1)
            wait_for(lambda: len(events(cluster, "worker_draining")) == 2, 60, "both draining")
            flag.touch()  # the tasks running on the draining nodes may finish now
            released = time.time()
            scaling_in.result(timeout=120)
        assert cluster.status.nodes_wanted == 1
        out, err = workload.communicate(timeout=300)
    finally:
        if workload.poll() is None:
            workload.kill()
        shutil.rmtree(flag.parent, ignore_errors=True)
    result = last_json_line(out)
    assert result["done"] == list(range(24)), err[-2000:]
    assert len(result["hosts"]) == 3  # the worker jobs' nodes did work
    for job_id in retired:
        wait_for(lambda job_id=job_id: not in_queue(job_id), 60, f"worker job {job_id} to end")
        wait_for(
            lambda job_id=job_id: not processes_of_job(cluster.job_dir, job_id),
            30,
            f"the Ray processes of worker job {job_id} to end",
        )
    wait_for(lambda: alive(cluster) == 1, 30, "1 node alive")
    assert cluster.state is State.READY and cluster.status.nodes_lost == ()
    ends = {e["worker_job"]: e for e in events(cluster, "worker_stopped")}
    drains = {e["worker_job"]: e for e in events(cluster, "worker_draining")}
    for job_id in retired:  # drained through Ray, not killed by the drain's timeout
        assert drains[job_id]["accepted"] is True
        assert ends[job_id]["reason"] == "drained: scaled in"
        assert ends[job_id]["t"] > released  # Ray waited for the tasks running there


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
