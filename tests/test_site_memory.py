"""The memory a site gives a job, on the real testbed of each Slurm release: a 1-CPU cluster
at the site's default memory works (its object store sized within what Ray's processes leave)
or, when it cannot fit, is refused before anything is submitted, saying what to ask for; and a
cluster that goes over its memory anyway (the Python API, which leaves the site's checks to
the magics, the panel and the REST API) ends as OUT_OF_MEMORY with that reason in its status
line and in its record (what the sidebar shows), not with a Ray traceback.
"""

from __future__ import annotations

import pytest

from jupyter_slurm_ray.aio import run_sync
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.errors import LimitError, SlurmRayError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.slurm.sitecheck import check_with_slurm
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.formatting import status_line

from .helpers.clusters import cluster_spec, wait_until_nothing_left
from .helpers.jobs import in_queue
from .helpers.testbed import ENFORCED, runuser

pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.compat]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    return Registry(tmp_path_factory.mktemp("state"))


def new_cluster(registry: Registry, **spec: object) -> SlurmRayCluster:
    """A 1-CPU cluster that asks for no memory (the site's default applies) unless told."""
    spec = {"cpus_per_node": 1, "mem_per_node": None, "object_store_memory": None, **spec}
    return SlurmRayCluster(
        cluster_spec(**spec), LocalTransport(runuser("alice")), registry=registry
    )


def test_a_one_cpu_cluster_at_the_sites_default_memory_works(registry):
    cluster = new_cluster(registry)
    run_sync(check_with_slurm(cluster.spec, cluster.transport))  # not refused: it fits
    try:
        cluster.up(connect=False)
        assert cluster.state is State.READY
        assert cluster.connection_info().node_count == 1
    finally:
        cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)


def test_a_cluster_that_cannot_fit_the_sites_default_is_refused_before_submitting(registry):
    cluster = new_cluster(registry, object_store_memory="700M")  # 860 + 60 + 700 MB
    checked = check_with_slurm(cluster.spec, cluster.transport)
    if not ENFORCED:  # nothing is killed for its memory here: nothing refused
        run_sync(checked)
        return
    with pytest.raises(LimitError) as refused:
        run_sync(checked)
    message = str(refused.value)
    assert message.startswith("mem_per_node: this site kills a job over its memory")
    assert "would get 1024 MB" in message and "ask for --mem 2G" in message
    assert cluster.job_id is None  # nothing was submitted


@pytest.mark.skipif(not ENFORCED, reason="the testbed does not enforce memory (its profile)")
def test_a_cluster_over_its_memory_ends_out_of_memory_saying_so(registry):
    cluster = new_cluster(registry, mem_per_node="600M")  # a head needs about 900 MB
    try:
        with pytest.raises(SlurmRayError):
            cluster.up(connect=False)  # the head is killed at 600 MB while it starts
        status = cluster.refresh()
        assert status.state is State.OUT_OF_MEMORY, (status.state, status.reason)
        reason = status.reason or ""
        assert reason.startswith("out of memory on node") and "limit of 600 MB" in reason
        assert "--mem (mem_per_node)" in reason and "Traceback" not in reason
        line = status_line(status)
        assert "OUT_OF_MEMORY" in line and "out of memory on node" in line
        record = cluster.registry.load(cluster.id)
        assert record is not None and record.state == "OUT_OF_MEMORY" and record.reason == reason
    finally:
        if cluster.job_id and in_queue(cluster.job_id):
            cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
