"""Containers on the real testbed: Ray in the Charliecloud image that scripts/container-image
builds (Debian 12 + a venv with the same Ray, and the marker file /etc/jsr-test-image), the
bootstrap on the node. Tasks prove they run inside; a GPU job's fake device is visible there;
down leaves nothing; bad settings fail with one line naming the field."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import ray

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import RayStartError, SpecError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import (
    cluster_spec,
    processes_of,
    ray_in_subprocess,
    ray_result,
    wait_until_nothing_left,
)
from .helpers.testbed import runuser
from .helpers.waiting import wait_for

# host_stack: Charliecloud and the image are the host's (scripts/setup --tests), not a root's
pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.host_stack]

IMAGE = os.environ.get("JSR_CONTAINER_IMAGE", "/opt/jupyter-slurm-ray/container-image")
FAKE_GPUS = "/var/lib/jsr-testbed/fakegpu"

INSIDE = """
import os, sys
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

FAKE_GPUS = os.environ["FAKE_GPUS"]  # the testbed's gres.conf names them
GPUS = int(os.environ["TASK_GPUS"])

@ray.remote(num_cpus=0)
def inside():
    marker = "/etc/jsr-test-image"
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = sorted(os.listdir(FAKE_GPUS)) if os.path.isdir(FAKE_GPUS) else None
    return {
        "host": socket.gethostname(),
        "marker": open(marker).read().strip() if os.path.exists(marker) else None,
        "python": sys.executable,
        "ray": ray.__version__,
        "cuda": cuda,
        "devices": devices,
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
    }

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
refs = [
    inside.options(num_gpus=GPUS, scheduling_strategy=Affinity(n, soft=False)).remote()
    for n in nodes
]
print(json.dumps(sorted(ray.get(refs), key=lambda r: r["host"])))
"""

needs_image = pytest.mark.skipif(
    not os.path.exists(f"{IMAGE}/etc/jsr-test-image"),
    reason=f"no test image at {IMAGE}: run scripts/container-image",
)


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    return Registry(tmp_path_factory.mktemp("state"))


def new_cluster(registry: Registry, **spec) -> SlurmRayCluster:
    spec = {"container": IMAGE, "container_runtime": "charliecloud", **spec}
    return SlurmRayCluster(
        cluster_spec(**spec), LocalTransport(runuser("alice")), registry=registry
    )


def tasks_inside(cluster: SlurmRayCluster, gpus: int = 0) -> list[dict]:
    info = cluster.connection_info()
    secret = Path(cluster.job_dir, "ray_token").read_text().strip()
    token = cluster.registry.store_token(cluster.id, secret)
    address = f"ray://{info.head_ip}:{info.client_port}"
    env = {"TASK_GPUS": str(gpus), "FAKE_GPUS": FAKE_GPUS}
    return ray_result(
        ray_in_subprocess(address, str(token), INSIDE, env=env, job_dir=cluster.job_dir)
    )


@needs_image
def test_two_nodes_run_ray_in_the_container_and_down_leaves_nothing(registry):
    cluster = new_cluster(registry, nodes=2)
    try:
        cluster.up(connect=False)
        assert cluster.status.nodes_joined == 2
        results = tasks_inside(cluster)
    finally:
        status = cluster.down()
    assert status.state is State.STOPPED
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    assert len({r["host"] for r in results}) == 2
    assert not Path("/opt/venv").exists()  # that Python exists only inside the image
    for result in results:
        assert result["marker"] == f"ray {ray.__version__}", result  # the image's marker file
        assert result["python"].startswith("/opt/venv/bin/python"), result  # the image's venv
        assert result["cuda"] in (None, ""), result
    print("tasks inside the container:", results)


@needs_image
def test_a_gpu_is_visible_inside_the_container(registry):
    cluster = new_cluster(registry, gpus_per_node=1)
    try:
        cluster.up(connect=False)
        results = tasks_inside(cluster, gpus=1)
    finally:
        cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    [result] = results
    assert result["marker"] is not None, result
    assert result["cuda"] is not None and len(result["cuda"].split(",")) == 1, result
    assert result["gpu_ids"] == result["cuda"].split(","), result  # Ray's GPU is Slurm's
    assert f"gpu{result['cuda']}" in (result["devices"] or []), result
    print("a GPU task inside the container:", result)


def test_an_unknown_runtime_is_refused_before_submitting(registry):
    with pytest.raises(SpecError, match=r"^container_runtime: "):
        new_cluster(registry, container_runtime="docker")


def test_a_missing_image_fails_naming_the_field_with_the_log(registry):
    cluster = new_cluster(registry, container="/nonexistent/image")
    with pytest.raises(RayStartError) as info:
        cluster.up()
    assert cluster.state is State.FAILED
    assert "container: the image /nonexistent/image does not exist" in str(info.value)
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


def test_a_runtime_missing_on_the_nodes_fails_naming_the_field(registry):
    cluster = new_cluster(registry, container_runtime="apptainer")
    with pytest.raises(RayStartError) as info:
        cluster.up()
    assert cluster.state is State.FAILED
    assert "container_runtime apptainer: no `apptainer` command" in str(info.value)
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


@needs_image
def test_scancel_of_a_container_cluster_leaves_nothing(registry):
    """The fault tests' rule: Ray's daemons in the container's namespaces go with the job."""
    cluster = new_cluster(registry, nodes=2)
    try:
        cluster.up(connect=False)
        assert processes_of(cluster.job_dir)
        subprocess.run(["scancel", cluster.job_id], check=True)
        wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    finally:
        cluster.down()


@needs_image
def test_a_worker_job_runs_ray_in_the_container_and_drains_through_it(registry):
    """Scaling out: the worker job's Ray is the image's too; scaling in drains it with the
    image's `ray drain-node`; then nothing is left."""
    cluster = new_cluster(registry, owner_timeout=60)
    try:
        cluster.up(connect=False)
        cluster.scale(2)
        wait_for(lambda: cluster.refresh().nodes_joined == 2, 120, "2 nodes alive")
        results = tasks_inside(cluster)
        worker_jobs = [job.job_id for job in cluster.workers.active()]
        cluster.scale(1)
        cluster.refresh()
        kinds = [e.get("event") for e in cluster.events]
    finally:
        cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    assert len(results) == 2 and all(r["marker"] for r in results), results
    assert all(r["python"].startswith("/opt/venv/bin/python") for r in results), results
    assert len(worker_jobs) == 1 and "worker_draining" in kinds, kinds
    assert "worker_drain_failed" not in kinds, kinds
