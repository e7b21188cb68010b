"""Scale and adapt never fight (issue 18, item 6), on a scripted Slurm whose sbatch is slow,
hangs or loses its answer: every change of worker jobs is one move under one lock; an sbatch is
never killed half way (a caller interrupted still gets its job recorded, an answer lost is
adopted by the jobs' tag); a manual scale while adapting is refused with the bounds, on every
path; ``down`` waits for an sbatch in flight and cancels what it queued."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.elastic import moves as workermoves
from jupyter_slurm_ray.elastic.adapt import Adapter
from jupyter_slurm_ray.elastic.policy import AdaptSettings
from jupyter_slurm_ray.elastic.raydemand import RayView, Shape
from jupyter_slurm_ray.errors import Conflict, SlurmRayError, SubmitOutcomeUnknown
from jupyter_slurm_ray.naming import cluster_id_of_worker_comment
from jupyter_slurm_ray.slurm.schedulers import watcher_for

from ..helpers.waiting import until
from .conftest import emit
from .test_scaling_logic import ready

ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
ONE_CPU = Shape(1.0, 0.0, None)
REFUSED = AdaptSettings(1, 3).refuses_scale("ray")


def worker_jobs(slurm, cluster) -> list[str]:
    """The worker jobs Slurm has for the cluster (by their tag), whatever the cluster knows."""
    return [
        job.job_id
        for job in slurm.jobs.values()
        if cluster_id_of_worker_comment(job.comment) == cluster.id
    ]


def sbatches(slurm) -> int:
    return len([call for call in slurm.calls if call[0] == "sbatch"])


def events(cluster, kind: str) -> list[dict]:
    lines = (Path(cluster.job_dir) / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


@pytest.fixture
def ray_demand(monkeypatch):
    """Adapt reads this instead of the dashboard: ``ray_demand.append(RayView(...))`` sets what
    Ray asks for from then on (none at first: nothing waits, the head busy)."""
    views = [RayView((), {"10.0.0.1": True}, ONE_CPU)]

    async def read_ray(self):
        return views[-1]

    monkeypatch.setattr(Adapter, "read_ray", read_ray)
    return views


def needing(nodes: int) -> RayView:
    return RayView((({"CPU": 1.0}, nodes),), {"10.0.0.1": True}, ONE_CPU)


# -- an sbatch is never killed half way ----------------------------------------------------------
async def test_a_scale_interrupted_while_sbatch_runs_still_records_its_job(
    make_cluster, slurm, transport
):
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch")  # Slurm queues the job; its answer comes late
    scaling = asyncio.ensure_future(cluster.scale_async(3))
    await asyncio.wait_for(hold.arrived.wait(), 5)
    scaling.cancel()  # a cell interrupted
    await asyncio.sleep(0.1)
    assert not scaling.done()  # told once the sbatch ended, not half way
    hold.release()
    with pytest.raises(asyncio.CancelledError):
        await scaling
    (queued,) = worker_jobs(slurm, cluster)  # the second sbatch never ran
    assert list(cluster.workers.jobs) == [queued] and cluster.status.nodes_wanted == 2
    assert queued in watcher_for(transport)._subscribers  # followed, as any worker job
    recorded = cluster.registry.load(cluster.id).worker_jobs
    assert [job["job_id"] for job in recorded] == [queued]


async def test_an_sbatch_whose_answer_is_lost_is_adopted_by_the_jobs_tag(
    make_cluster, slurm, transport
):
    cluster = await ready(make_cluster, slurm)
    transport.hang_after = "sbatch"  # queued, then the connection dropped
    status = await cluster.scale_async(2)
    (queued,) = worker_jobs(slurm, cluster)
    assert list(cluster.workers.jobs) == [queued] and status.nodes_wanted == 2
    (scaled,) = events(cluster, "scaled")
    assert scaled["submitted"] == [queued]


async def test_an_sbatch_of_unknown_outcome_is_looked_up_before_the_next_move(
    make_cluster, slurm, transport
):
    """The answer lost and Slurm not answering the lookup either: the error says so, and
    down (the next move) finds the job by its tag and cancels it."""
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch")
    scaling = asyncio.ensure_future(cluster.scale_async(2))
    await asyncio.wait_for(hold.arrived.wait(), 5)
    transport.hang_after, slurm.down = "sbatch", True
    hold.release()
    with pytest.raises(SubmitOutcomeUnknown, match="submitted 0 of 1 worker jobs; the next"):
        await scaling
    (queued,) = worker_jobs(slurm, cluster)
    assert cluster.workers.jobs == {}
    del transport.holds["sbatch"]
    transport.hang_after, slurm.down = None, False
    await cluster.down_async(timeout=5)
    assert list(cluster.workers.jobs) == [queued] and slurm.job(queued).state == "CANCELLED"


async def test_an_sbatch_killed_as_the_loop_closes_is_found_by_down(make_cluster, slurm, transport):
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch")
    scaling = asyncio.ensure_future(cluster.scale_async(2))
    await asyncio.wait_for(hold.arrived.wait(), 5)
    (sbatch,) = [t for t in asyncio.all_tasks() if "_submit_one" in repr(t.get_coro())]
    sbatch.cancel()  # what a closing loop does to every task: the sbatch killed half way
    with pytest.raises(asyncio.CancelledError):
        await scaling
    (queued,) = worker_jobs(slurm, cluster)
    assert cluster.workers.jobs == {}  # queued, unknown here
    hold.release()
    await cluster.down_async(timeout=5)
    assert slurm.job(queued).state == "CANCELLED"


# -- down during a scale-out ---------------------------------------------------------------------
async def test_down_waits_for_an_sbatch_in_flight_and_cancels_what_it_queued(
    make_cluster, slurm, transport
):
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch", after=False)  # the controller slow to take it
    scaling = asyncio.ensure_future(cluster.scale_async(3))
    await asyncio.wait_for(hold.arrived.wait(), 5)
    stopping = asyncio.ensure_future(cluster.down_async(timeout=5))
    await asyncio.sleep(0.2)
    assert not stopping.done()
    assert [call for call in slurm.calls if call[0] == "scancel"] == []  # it waits
    hold.release()
    await stopping
    with pytest.raises(SlurmRayError, match="submitted 1 of 2 worker jobs; the cluster stops"):
        await scaling
    (queued,) = worker_jobs(slurm, cluster)  # no second sbatch once down began
    assert sbatches(slurm) == 2  # the head's and that one
    assert slurm.job(queued).state == "CANCELLED"
    assert not [job for job in slurm.jobs.values() if job.state in ACTIVE]


async def test_down_while_adapts_sbatch_runs_waits_for_it_and_cancels_its_job(
    make_cluster, slurm, transport, ray_demand
):
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch")
    ray_demand.append(needing(2))
    await cluster.adapt_async(1, 2, interval=0.05)
    await asyncio.wait_for(hold.arrived.wait(), 5)
    stopping = asyncio.ensure_future(cluster.down_async(timeout=5))
    await asyncio.sleep(0.2)
    assert not stopping.done()  # the adapt loop stops once its sbatch ended
    hold.release()
    await stopping
    (queued,) = worker_jobs(slurm, cluster)
    assert list(cluster.workers.jobs) == [queued] and slurm.job(queued).state == "CANCELLED"
    assert cluster.adapting is None


# -- scale and adapt -----------------------------------------------------------------------------
async def test_a_manual_scale_while_adapting_is_refused_with_the_bounds(
    make_cluster, slurm, ray_demand
):
    cluster = await ready(make_cluster, slurm, worker_groups={"gpu": {"gpus_per_node": 1}})
    await cluster.adapt_async(1, 3, interval=0.05)
    with pytest.raises(Conflict) as refused:
        await cluster.scale_async(2)
    assert str(refused.value) == REFUSED
    assert sbatches(slurm) == 1  # the head's only
    await cluster.scale_async(1, group="gpu")  # adapt sizes the default group only
    (gpu,) = cluster.workers.jobs
    assert cluster.workers.jobs[gpu].group == "gpu"
    await cluster.stop_adapting_async()
    await cluster.scale_async(2)  # adapting off: scaled by hand again
    assert len(cluster.workers.active("default")) == 1


async def test_adapt_decides_after_a_manual_scale_in_flight_and_counts_its_job(
    make_cluster, slurm, transport, ray_demand
):
    """Without one lock, adapt's first decision would not see the job being submitted and
    would submit two more: 4 nodes, above its maximum of 3."""
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch", after=False)
    scaling = asyncio.ensure_future(cluster.scale_async(2))
    await asyncio.wait_for(hold.arrived.wait(), 5)
    ray_demand.append(needing(2))  # two more one-CPU nodes wanted
    await cluster.adapt_async(1, 3, interval=0.05)
    await asyncio.sleep(0.3)  # adapt's steps wait for the scale's move
    assert hold.count == 1
    hold.release()
    await scaling
    await until(lambda: len(cluster.workers.jobs) == 2, 5, "adapt's one job more")
    await asyncio.sleep(0.3)  # a few more of adapt's steps: nothing more to do
    await cluster.stop_adapting_async()
    assert len(worker_jobs(slurm, cluster)) == 2  # head + 2 = the maximum of 3 nodes
    (adapted,) = [e for e in events(cluster, "scaled") if e["cause"].startswith("adapt:")]
    assert (adapted["nodes_before"], adapted["nodes"]) == (2, 3)


async def test_adapt_stopped_while_its_sbatch_runs_keeps_the_job(
    make_cluster, slurm, transport, ray_demand
):
    cluster = await ready(make_cluster, slurm)
    hold = transport.hold("sbatch")
    ray_demand.append(needing(1))
    await cluster.adapt_async(1, 2, interval=0.05)
    await asyncio.wait_for(hold.arrived.wait(), 5)
    stopping = asyncio.ensure_future(cluster.stop_adapting_async())
    await asyncio.sleep(0.1)
    assert not stopping.done()
    hold.release()
    await stopping
    (queued,) = worker_jobs(slurm, cluster)
    assert list(cluster.workers.jobs) == [queued] and cluster.status.nodes_wanted == 2


async def test_another_process_is_refused_while_the_owner_adapts(
    make_cluster, slurm, transport, ray_demand
):
    """The CLI, another kernel, the server: refused from the owner's record while it adapts;
    heard after an ``adapt --off`` it asked just before (the owner applies both in order)."""
    cluster = await ready(make_cluster, slurm)
    await cluster.adapt_async(1, 3, interval=0.05)
    record = cluster.registry.load(cluster.id)
    assert record.scaling[0] == AdaptSettings(1, 3).describe()
    other = SlurmRayCluster.from_record(record, transport, registry=cluster.registry)
    with pytest.raises(Conflict) as refused:
        await other.request_scale_async(2)
    assert str(refused.value) == REFUSED and events(cluster, "scale_request") == []
    await other.request_adapt_async(off=True)
    await other.request_scale_async(2)  # not refused: adapt was asked to stop first
    await until(lambda: len(cluster.workers.jobs) == 1, 5, "the scale applied after the off")
    assert cluster.adapting is None and events(cluster, "scale_refused") == []


async def test_a_scale_request_the_owner_reads_while_adapting_is_refused_and_shown(
    make_cluster, slurm, ray_demand
):
    """A request written from a view older than adapt's start: the owner refuses it, tells
    it in the events, and shows it with adapt's decisions."""
    cluster = await ready(make_cluster, slurm)
    await cluster.adapt_async(1, 3, interval=0.05)
    emit(cluster, {"t": 9e9, "event": "scale_request", "role": "client", "nodes": 3, "pid": 7})
    await until(lambda: events(cluster, "scale_refused"), 5, "the refusal told")
    (refusal,) = events(cluster, "scale_refused")
    assert refusal["cause"].startswith("scale to 3 nodes (asked by pid 7 on None) refused: ")
    assert refusal["cause"].endswith(REFUSED)
    assert any("refused" in line for line in cluster.status.scaling)
    assert sbatches(slurm) == 1


async def test_a_drain_holds_no_lock_and_what_outlives_it_is_cancelled_after(
    make_cluster, slurm, monkeypatch
):
    monkeypatch.setattr(workermoves, "DRAIN_GRACE", 0.0)
    cluster = await ready(make_cluster, slurm)
    await cluster.scale_async(2)
    (first,) = cluster.workers.jobs
    slurm.run(first, "node2")
    await until(lambda: cluster.workers.jobs[first].state == "RUNNING", 5, "it runs")
    draining = asyncio.ensure_future(cluster.scale_async(1, drain_timeout=1.0))
    await until(lambda: cluster.workers.draining() == [first], 5, "the drain begun")
    assert "draining worker job" in cluster.status.scaling[-1]
    await cluster.scale_async(2)  # not held up by the drain: a new job at once
    assert len(cluster.workers.active()) == 1 and not draining.done()
    await draining  # scale(1) returns once the drained job ended: here cancelled, its time up
    assert slurm.job(first).state == "CANCELLED"
    assert cluster.workers.draining() == []
