"""Scaling with worker jobs on a scripted Slurm (issue 9): what is submitted, cancelled and
drained, what the status and the record show, and that bad input changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jupyter_slurm_ray.elastic.workerjob import worker_minutes
from jupyter_slurm_ray.elastic.workerjobs import checked_node_count
from jupyter_slurm_ray.errors import SlurmRayError, SpecError
from jupyter_slurm_ray.inventory import find_orphans
from jupyter_slurm_ray.naming import (
    cluster_id_of_comment,
    cluster_id_of_worker_comment,
    job_comment,
    worker_job_comment,
)
from jupyter_slurm_ray.registry import ClusterRecord
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.schedulers import watcher_for
from jupyter_slurm_ray.states import State

from ..helpers.bootstrap import bootstrap_module
from ..helpers.fakeslurm import FakeJob
from ..helpers.waiting import until
from .conftest import emit, write_connection


async def ready(make_cluster, slurm, **spec):
    cluster = make_cluster(**spec)
    await cluster.up_async(wait=False)
    slurm.run(cluster.job_id)
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 1, "node_count": 1})
    await until(lambda: cluster.state is State.READY, 5, "READY")
    return cluster


def squeue_calls(slurm) -> int:
    return len([call for call in slurm.calls if call[0] == "squeue"])


async def test_scale_out_submits_tagged_one_node_worker_jobs_shown_pending(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    status = await cluster.scale_async(3)
    workers = list(cluster.workers.jobs)
    assert len(workers) == 2 and status.nodes_wanted == 3
    for job_id in workers:
        job = slurm.job(job_id)
        assert cluster_id_of_worker_comment(job.comment) == cluster.id
        assert cluster_id_of_comment(job.comment) is None  # never taken for a head job
        script = job.script  # what sbatch got on its stdin
        assert "#SBATCH --nodes=1" in script and " workerjob " in script
        assert "#SBATCH --time=00:09:00" in script  # the head's 9:50 left, never more
    await until(
        lambda: [j.reason for j in cluster.status.worker_jobs_pending] == ["Priority"] * 2,
        5,
        "the worker jobs pending with Slurm's reason",
    )
    record = cluster.registry.load(cluster.id)
    assert sorted(j["job_id"] for j in record.worker_jobs) == sorted(workers)
    assert record.nodes_wanted == 3


async def test_the_head_and_its_worker_jobs_share_one_squeue_per_poll(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(3)
    watcher = watcher_for(cluster.transport)
    assert set(watcher._subscribers) == {cluster.job_id, *cluster.workers.jobs}
    first, second = cluster.workers.jobs
    slurm.run(first, "node2")
    slurm.run(second, "node3")
    await until(
        lambda: {j.host for j in cluster.status.worker_jobs} == {"node2", "node3"},
        5,
        "both worker jobs running",
    )
    polls, queries = watcher.polls, squeue_calls(slurm)
    await until(lambda: watcher.polls >= polls + 4, 5, "four more polls")
    # one squeue a poll for the three jobs (give or take the one in flight when counted)
    assert abs((squeue_calls(slurm) - queries) - (watcher.polls - polls)) <= 1


async def test_worker_jobs_joining_count_and_their_errors_do_not_fail_the_cluster(
    make_cluster, slurm
):
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(2)
    (worker,) = cluster.workers.jobs
    slurm.run(worker, "node2")
    emit(
        cluster,
        {"event": "worker_joined", "role": "worker", "host": "node2", "worker_job": worker},
        {"event": "nodes", "joined": 2, "wanted": 1},
    )
    await until(lambda: cluster.status.nodes_joined == 2, 5, "2 nodes alive")
    assert cluster.status.worker_jobs[0].joined and cluster.status.worker_jobs[0].host == "node2"
    emit(cluster, {"event": "error", "role": "worker", "reason": "boom", "worker_job": worker})
    slurm.end(worker, "FAILED", "1:0")
    await until(lambda: not cluster.status.worker_jobs, 5, "the ended worker job gone")
    assert cluster.state is State.READY
    assert cluster.status.nodes_wanted == 1  # an ended worker job is no longer wanted


async def test_scale_in_cancels_pending_jobs_first_then_drains_running_ones(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(3)
    first, second = cluster.workers.jobs
    slurm.run(first, "node2")
    await until(lambda: cluster.workers.jobs[first].state == "RUNNING", 5, "first running")

    await cluster.scale_async(2)  # the pending one goes, the running one stays
    assert slurm.job(second).state == "CANCELLED" and slurm.job(first).state == "RUNNING"
    assert not (Path(cluster.job_dir) / f"drain-{first}").exists()

    async def job_drains_and_ends() -> None:
        drain = Path(cluster.job_dir) / f"drain-{first}"
        await until(drain.exists, 5, "the drain request")
        assert float(drain.read_text()) == 30
        slurm.end(first)  # the worker job drained and exited by itself

    ending = asyncio.ensure_future(job_drains_and_ends())
    status = await cluster.scale_async(1, drain_timeout=30)
    await ending
    assert status.nodes_wanted == 1 and slurm.job(first).state == "COMPLETED"
    cancels = [call[-1] for call in slurm.calls if call[0] == "scancel"]
    assert cancels == [second]  # the drained one ended by itself: nothing to cancel


async def test_the_heads_end_cancels_its_worker_jobs(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(3)
    first, second = cluster.workers.jobs
    slurm.run(first, "node2")
    slurm.end(cluster.job_id, "CANCELLED")
    await until(lambda: cluster.state is State.CANCELLED, 5, "the head cancelled")
    assert slurm.job(first).state == "CANCELLED" and slurm.job(second).state == "CANCELLED"


async def test_down_cancels_the_worker_jobs_too(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(2)
    (worker,) = cluster.workers.jobs
    slurm.run(worker, "node2")

    await cluster.down_async(timeout=5)
    assert slurm.job(worker).state == "CANCELLED"


@pytest.mark.parametrize("bad", [-1, 0, 1.5, "three", True, None])
async def test_bad_input_is_one_line_naming_nodes_and_changes_nothing(make_cluster, slurm, bad):
    cluster = await ready(make_cluster, slurm)
    jobs_before = set(slurm.jobs)
    with pytest.raises(SpecError) as caught:
        await cluster.scale_async(bad)
    assert str(caught.value).startswith("nodes") and "\n" not in str(caught.value)
    assert set(slurm.jobs) == jobs_before and cluster.status.nodes_wanted == 1


async def test_a_cluster_not_up_yet_is_not_scaled(make_cluster, slurm):
    cluster = make_cluster()
    await cluster.up_async(wait=False)
    with pytest.raises(SlurmRayError, match="once it is up"):
        await cluster.scale_async(2)
    assert len(slurm.jobs) == 1


async def test_another_process_sees_the_worker_jobs_in_the_record(make_cluster, slurm, transport):
    from jupyter_slurm_ray.cluster import SlurmRayCluster

    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(2)
    record = cluster.registry.load(cluster.id)
    other = SlurmRayCluster.from_record(record, transport, registry=cluster.registry)
    assert list(other.workers.jobs) == list(cluster.workers.jobs)
    assert other.status.nodes_wanted == 2 and len(other.status.worker_jobs) == 1
    assert other.slurm_job_ids() == [cluster.job_id, *cluster.workers.jobs]


def test_a_worker_jobs_walltime_is_the_heads_time_left_in_whole_minutes() -> None:
    assert worker_minutes(590, at=1000.0, now=1000.0) == 9
    assert worker_minutes(590, at=1000.0, now=1060.0) == 8  # counted down since the answer
    assert worker_minutes(30, at=1000.0, now=1000.0) == 1
    assert worker_minutes(None, at=1000.0, now=1000.0) is None  # unknown: the spec's


def test_a_node_count_is_a_whole_number_from_the_heads_allocation_up() -> None:
    assert checked_node_count(3, 1) == 3 and checked_node_count("4", 2) == 4
    with pytest.raises(SpecError, match="at least 2"):
        checked_node_count(1, 2)


# -- the bootstrap's side: pure pieces -----------------------------------------------------------
def test_nodes_leaving_on_purpose_are_not_reported_lost() -> None:
    nodewatch = bootstrap_module("nodewatch")
    events: list[tuple[str, dict]] = []
    dashapi = bootstrap_module("dashapi")
    watch = nodewatch.NodeWatch(1, lambda event, **f: events.append((event, f)), lambda h: [])
    watch.hosts = {"10.0.0.1": "node1", "10.0.0.2": "node2", "10.0.0.3": "node3"}
    nodes = [dashapi.AliveNode(f"10.0.0.{n}", f"id{n}") for n in (1, 2, 3)]
    watch.note(nodes)
    watch.leaving.add("id2")  # its worker_leaving event names its Ray node id
    watch.check_lost(nodes[:1])
    lost = [fields["hosts"] for event, fields in events if event == "node_lost"]
    assert lost == [["node3"]]


def test_a_drain_request_holds_its_timeout() -> None:
    workerjob = bootstrap_module("workerjob")
    assert workerjob.drain_timeout("30\n") == 30.0
    assert workerjob.drain_timeout("soon") == workerjob.DEFAULT_DRAIN_TIMEOUT
    assert workerjob.drain_timeout("-5") == workerjob.DEFAULT_DRAIN_TIMEOUT


async def test_gc_offers_worker_jobs_no_live_cluster_lists(registry, transport, slurm):
    listed = {"job_id": "11", "state": "RUNNING"}
    registry.save(
        ClusterRecord(
            id="live-0001", name="live", target="fake", job_dir="/x", job_id="10",
            state="READY", worker_jobs=[listed],
        )
    )  # fmt: skip
    slurm.jobs["10"] = FakeJob("10", "", comment=job_comment("live-0001"), state="RUNNING")
    for job_id, cluster_id in (("11", "live-0001"), ("12", "live-0001"), ("13", "gone-0001")):
        comment = worker_job_comment(cluster_id)
        slurm.jobs[job_id] = FakeJob(job_id, "", comment=comment, state="RUNNING")
    orphans = await find_orphans(SlurmClient(transport), registry)
    assert [(o.job_id, o.why) for o in orphans] == [
        ("12", "a worker job its cluster's record does not list"),
        ("13", "a worker job without a record of its cluster"),
    ]


async def test_joined_worker_jobs_are_asked_about_as_seldom_as_a_ready_head(make_cluster, slurm):
    """A cluster of 3 jobs in steady state: one squeue every steady_poll_interval, not every
    poll_interval because it has worker jobs (benchmarks/worker_polls.py measures it)."""
    cluster = await ready(make_cluster, slurm)
    cluster.steady_poll_interval = 1.0
    await cluster.scale_async(3)
    watcher = watcher_for(cluster.transport)
    first, second = cluster.workers.jobs
    slurm.run(first, "node2")
    await until(lambda: cluster.status.worker_jobs[0].state == "RUNNING", 5, "one running")
    assert watcher.pace == cluster.poll_interval  # one still pending, one not joined yet
    slurm.run(second, "node3")
    emit(
        cluster,
        *(
            {"event": "worker_joined", "role": "worker", "host": host, "worker_job": job_id}
            for job_id, host in ((first, "node2"), (second, "node3"))
        ),
        {"event": "nodes", "joined": 3, "wanted": 1},
    )
    await until(lambda: cluster.status.nodes_joined == 3, 5, "3 nodes alive")
    await until(lambda: watcher.pace == 1.0, 5, "the steady pace for all three jobs")


async def test_a_worker_jobs_own_events_say_it_runs_before_squeue_does(make_cluster, slurm):
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(2)
    (worker,) = cluster.workers.jobs
    emit(
        cluster, {"event": "worker_joined", "role": "worker", "host": "node2", "worker_job": worker}
    )
    await until(lambda: cluster.status.worker_jobs[0].joined, 5, "the worker joined")
    (job,) = cluster.status.worker_jobs
    assert (job.state, job.host) == ("RUNNING", "node2")  # Slurm still says PENDING
    assert cluster.status.worker_jobs_pending == ()
