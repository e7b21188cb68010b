"""Worker groups for real (issue 9): a CPU head on the `solo` partition, a `gpu` group of
worker jobs on the `solo-short` partition (the same nodes, another partition) with one of the
testbed's GPUs each (a task sent to the group sees its GPU), and a `brief` group of 2-minute
worker jobs rotated before they end. Real sbatch, real Ray, as alice; nothing left at the
end."""

from __future__ import annotations

import subprocess

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import SlurmError, SpecError
from jupyter_slurm_ray.naming import worker_job_comment
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.formatting import scaling_text

from .helpers.clusters import cluster_spec, ray_in_subprocess, ray_result, wait_until_nothing_left
from .helpers.jobs import in_queue, jobs_with_comment
from .helpers.testbed import SOLO, runuser
from .helpers.waiting import wait_for

# solo: the rotation must find a CPU for the replacement before the 2-minute job ends
pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.solo]

QUEUE_WAIT = 300  # the previous solo test's jobs may still be ending

IN_THE_GROUP = """
import os

@ray.remote(num_gpus=1, resources={"group:gpu": 0.01})
def where():
    return socket.gethostname(), ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

print(json.dumps(ray.get(where.remote())))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, solo_nodes):
    registry = Registry(tmp_path_factory.mktemp("state"))
    spec = cluster_spec(
        partition=SOLO,
        cpus_per_node=2,
        worker_groups={
            "gpu": {"partition": f"{SOLO}-short", "gpus_per_node": 1, "time": "20"},
            # rotated: ends 8 min before the head; one CPU, so that the replacement may start
            # beside the old one whatever holds the other nodes
            "brief": {"partition": f"{SOLO}-short", "time": "2", "cpus_per_node": 1},
            # a partition the testbed does not have: Slurm refuses its jobs at sbatch
            "nowhere": {"partition": "nosuch"},
        },
        worker_rotation=75,
    )
    cluster = SlurmRayCluster(spec, LocalTransport(runuser("alice")), registry=registry)
    cluster.up(connect=False, queue_timeout=QUEUE_WAIT)
    yield cluster
    cluster.down()
    leftover = [job_id for job_id in cluster.workers.jobs if in_queue(job_id)]
    subprocess.run(["scancel", *leftover], check=False, capture_output=True)


@pytest.mark.compat
def test_a_gpu_group_on_another_partition_runs_the_tasks_sent_to_it(cluster):
    cluster.scale(1, group="gpu")
    (job,) = cluster.workers.active("gpu")
    assert job.group == "gpu"
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job.job_id], capture_output=True, text=True, check=True
    ).stdout
    assert f"Partition={SOLO}-short" in shown and "gpu:1" in shown, shown
    wait_for(lambda: cluster.refresh().nodes_joined == 2, QUEUE_WAIT, "the gpu worker to join")
    assert "worker jobs: gpu: 1 running" in scaling_text(cluster.status)
    with open(f"{cluster.job_dir}/ray_token") as f:
        token = cluster.registry.store_token(cluster.id, f.read().strip())
    info = cluster.connection_info()
    address = f"ray://{info.head_ip}:{info.client_port}"
    result = ray_in_subprocess(address, str(token), IN_THE_GROUP, job_dir=cluster.job_dir)
    host, gpu_ids, visible = ray_result(result)
    assert host == job.host and host != info.head_host
    assert len(gpu_ids) == 1 and visible is not None and visible != ""
    cluster.scale(0, group="gpu")
    wait_for(lambda: not in_queue(job.job_id), 90, "the gpu worker job to end")
    assert cluster.refresh().nodes_joined == 1


def test_a_worker_job_of_short_walltime_is_replaced_before_it_ends(cluster):
    """worker_rotation 75 s: the 2-minute worker job gets a replacement after ~45 s; once that
    joined, the old one is drained; the cluster keeps its 2 nodes throughout."""
    cluster.scale(1, group="brief")
    (old,) = cluster.workers.active("brief")
    wait_for(lambda: cluster.refresh().nodes_joined == 2, QUEUE_WAIT, "the brief worker to join")
    wait_for(lambda: cluster.workers.jobs[old.job_id].replaced_by, 150, "a replacement")
    new_id = cluster.workers.jobs[old.job_id].replaced_by
    assert cluster.workers.jobs[new_id].group == "brief"
    wait_for(lambda: not in_queue(old.job_id), QUEUE_WAIT, "the old worker job to end")
    assert in_queue(new_id)
    wait_for(lambda: cluster.refresh().nodes_joined == 2, 60, "2 nodes alive again")
    rotated = [e for e in cluster.events if e.get("event") == "rotated"]
    assert [e["step"] for e in rotated] == ["submitted", "draining"], rotated
    assert rotated[0]["old"] == old.job_id and rotated[0]["new"] == new_id
    drained = [e for e in cluster.events if e.get("worker_job") == old.job_id]
    assert any(e["event"] in ("worker_leaving", "worker_stopped") for e in drained), drained
    cluster.scale(0, group="brief")
    wait_for(lambda: not in_queue(new_id), 90, "the replacement to end")


def test_a_group_the_cluster_does_not_have_is_one_line_and_changes_nothing(cluster):
    before = dict(cluster.workers.jobs)
    with pytest.raises(SpecError) as error:
        cluster.scale(1, group="bigmem")
    assert error.value.field == "group" and "default, brief, gpu" in str(error.value)
    with pytest.raises(SpecError) as error:
        cluster.scale(-1, group="gpu")
    assert error.value.field == "nodes"
    assert cluster.workers.jobs == before


def test_a_group_slurm_refuses_is_one_line_naming_it_and_changes_nothing(cluster):
    """The `nowhere` group's partition does not exist: sbatch refuses its worker job."""
    cluster.refresh()
    before = (cluster.status.nodes_wanted, dict(cluster.workers.jobs))
    in_slurm = jobs_with_comment(worker_job_comment(cluster.id))
    scaled = [e for e in cluster.events if e.get("event") == "scaled"]
    with pytest.raises(SlurmError) as error:
        cluster.scale(1, group="nowhere")
    message = str(error.value)
    assert "\n" not in message, message
    assert "nowhere" in message, message  # the group
    assert "invalid partition" in message.lower() and "nosuch" in message, message  # Slurm's
    cluster.refresh()
    assert (cluster.status.nodes_wanted, dict(cluster.workers.jobs)) == before
    assert not cluster.workers.active("nowhere")
    assert jobs_with_comment(worker_job_comment(cluster.id)) == in_slurm  # no new job in Slurm
    assert [e for e in cluster.events if e.get("event") == "scaled"] == scaled


@pytest.mark.compat
def test_down_leaves_nothing(cluster):
    job_ids = list(cluster.workers.jobs)
    cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    assert not [job_id for job_id in job_ids if in_queue(job_id)]
