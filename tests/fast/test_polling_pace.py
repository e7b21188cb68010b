"""Kind to the controller: Slurm is asked often only while a change is expected, seldom once a
cluster is up, at once when the job's own events say something changed, and one answer serves
all of a user's processes on a host (the shared queue)."""

from __future__ import annotations

import asyncio

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.queuecache import SharedQueue
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State

from ..helpers.fakeslurm import FakeTransport
from ..helpers.waiting import until
from .conftest import emit, write_connection


def paced_cluster(transport, registry, jobs_root) -> SlurmRayCluster:
    """A cluster whose watch ticks every 50 ms and, once up, asks Slurm only every hour."""
    spec = ClusterSpec(time="10", job_dir_root=str(jobs_root), owner_timeout=8)
    return SlurmRayCluster(
        spec, transport, registry=registry, poll_interval=0.05, steady_poll_interval=3600
    )


def squeues(slurm) -> int:
    return sum(1 for call in slurm.calls if call[0] == "squeue")


async def test_a_steady_cluster_asks_slurm_seldom_and_at_once_on_news(
    transport, registry, jobs_root, slurm
):
    cluster = paced_cluster(transport, registry, jobs_root)
    try:
        await cluster.up_async(wait=False)
        slurm.run(cluster.job_id)
        write_connection(cluster)
        emit(cluster, {"event": "phase", "phase": "bootstrap"}, {"event": "ready", "joined": 1})
        await until(lambda: cluster.state is State.READY, 5, "READY")
        asked = squeues(slurm)
        await asyncio.sleep(1.0)  # twenty ticks of 50 ms
        assert squeues(slurm) == asked  # steady: the events are read, Slurm is not asked
        slurm.end(cluster.job_id, "CANCELLED")
        emit(cluster, {"event": "stopped", "reason": "signal SIGTERM"})
        await until(lambda: cluster.state.is_final, 5, "the end, asked at once")
        assert cluster.state is State.CANCELLED and squeues(slurm) <= asked + 2
    finally:
        await cluster.close_async()


async def test_one_squeue_answers_every_process_of_the_user(tmp_path, slurm):
    """Two 'processes' (two clients, two transports) of one user share one squeue."""
    first, second = FakeTransport(slurm), FakeTransport(slurm)
    for job in ("7", "8"):
        slurm.jobs[job] = slurm.jobs.get(job) or _job(job)
    queues = [SharedQueue(tmp_path, "fake") for _ in range(2)]
    clients = [SlurmClient(t, shared=q) for t, q in zip((first, second), queues, strict=True)]
    answers = await asyncio.gather(
        clients[0].query(["7"], max_age=10), clients[1].query(["8"], max_age=10)
    )
    assert answers[0]["7"].state == "RUNNING" and answers[1]["8"].state == "RUNNING"
    assert squeues(slurm) == 1  # the second waited for the first's answer, then read it
    await clients[1].query(["7", "8"], max_age=10)
    assert squeues(slurm) == 1
    await clients[1].query(["7"], max_age=0)  # too old for this caller: asked again
    assert squeues(slurm) == 2


def _job(job_id: str):
    from ..helpers.fakeslurm import FakeJob

    return FakeJob(job_id, "", state="RUNNING", reason="None", nodes="node1")


async def test_the_inventory_takes_the_queue_a_kernel_just_asked_for(registry, transport, slurm):
    from jupyter_slurm_ray.inventory import Inventory
    from jupyter_slurm_ray.naming import job_comment
    from jupyter_slurm_ray.registry import ClusterRecord
    from jupyter_slurm_ray.targets import Transports

    from ..helpers.fakeslurm import FakeJob

    registry.save(ClusterRecord(id="c-0001", name="c", target="fake", job_dir="/j", job_id="7"))
    slurm.jobs["7"] = FakeJob("7", "", comment=job_comment("c-0001"), state="RUNNING")
    kernel = SlurmClient(transport, shared=SharedQueue(registry.path, transport.target))
    await kernel.query(["7"])
    assert squeues(slurm) == 1
    inventory = Inventory(registry, Transports(lambda: transport), shared_max_age=60)
    assert [e.status.state for e in await inventory.entries()] == [State.STARTING]
    assert squeues(slurm) == 1  # the kernel's answer served the listing
    slurm.end("7", "CANCELLED")
    inventory.expire()  # we changed something ourselves: ask Slurm, not the shared answer
    assert [e.status.state for e in await inventory.entries()] == [State.CANCELLED]
    assert squeues(slurm) == 2


async def test_a_queue_answer_older_than_a_record_is_not_taken_for_it(registry, transport, slurm):
    """A job that ended just before its record was written: the shared answer, taken while it
    ran, says nothing about it (the dashboard's 503 page would say "last seen READY")."""
    from jupyter_slurm_ray.inventory import Inventory
    from jupyter_slurm_ray.naming import job_comment
    from jupyter_slurm_ray.registry import ClusterRecord
    from jupyter_slurm_ray.targets import Transports

    from ..helpers.fakeslurm import FakeJob

    slurm.jobs["7"] = FakeJob("7", "", comment=job_comment("c-0001"), state="RUNNING")
    kernel = SlurmClient(transport, shared=SharedQueue(registry.path, transport.target))
    await kernel.query(["7"])
    slurm.end("7", "COMPLETED")
    record = ClusterRecord(
        id="c-0001", name="c", target="fake", job_dir="/j", job_id="7", state="READY"
    )
    registry.save(record)
    inventory = Inventory(registry, Transports(lambda: transport), shared_max_age=60)
    assert (await inventory.status_of(record)).state is State.STOPPED
    assert squeues(slurm) == 2


async def test_a_pending_job_asks_slurm_seldom_but_notices_its_start_at_once(
    transport, registry, jobs_root, slurm
):
    cluster = paced_cluster(transport, registry, jobs_root)
    try:
        await cluster.up_async(wait=False)
        await until(lambda: cluster.status.reason == "Priority", 5, "PENDING, asked once")
        asked = squeues(slurm)
        await asyncio.sleep(1.0)  # twenty ticks: its events are read, Slurm is not asked
        assert squeues(slurm) == asked
        slurm.run(cluster.job_id)
        emit(cluster, {"event": "phase", "phase": "bootstrap"})
        await until(lambda: cluster.state is State.STARTING, 1.0, "STARTING within a tick or so")
        assert squeues(slurm) == asked + 1  # the event asked Slurm at once
    finally:
        await cluster.close_async()
