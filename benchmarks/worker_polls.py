"""Slurm calls per poll when clusters own worker jobs (issue 9): 1 cluster of 4 jobs (the head
and 3 worker jobs) and 10 such clusters, each owned by its own "kernel" on one login node.

Every job of a cluster is watched in the same ``squeue`` as its head, and the kernels of one
user share one ``squeue --me`` answer (``slurm/queuecache.py``), so the calls should not grow with
the number of jobs. Measured side by side with the same clusters without worker jobs. Slurm
is the scripted one of the fast tier (``tests/helpers/fakeslurm.py``): calls are counted, not
timed; the events and leases are real files. Run:
    /opt/jupyter-slurm-ray/venv/bin/python benchmarks/worker_polls.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from benchmarks.slurm_rpcs import steady_clusters
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.slurm.schedulers import watcher_for
from tests.fast.conftest import emit
from tests.helpers.fakeslurm import FakeSlurm

WORKER_JOBS = 3


async def with_worker_jobs(slurm: FakeSlurm, cluster: SlurmRayCluster, count: int) -> None:
    """``count`` worker jobs submitted, running and joined, as their own events say."""
    await cluster.scale_async(1 + count)
    for number, job_id in enumerate(cluster.workers.jobs, start=2):
        slurm.run(job_id, f"node{number}")
        emit(
            cluster,
            {
                "event": "worker_joined",
                "role": "worker",
                "host": f"node{number}",
                "worker_job": job_id,
            },
        )
    emit(cluster, {"event": "nodes", "joined": 1 + count, "wanted": 1})
    while (await cluster.refresh_async()).nodes_joined < 1 + count:
        await asyncio.sleep(0.1)


async def scenario(clusters: int, workers: int, seconds: float) -> dict[str, float]:
    slurm = FakeSlurm()
    with tempfile.TemporaryDirectory(prefix="jsr-polls-") as tmp:
        owned = await steady_clusters(slurm, Path(tmp), clusters, shared=True, steady=15.0)
        for cluster in owned:
            await with_worker_jobs(slurm, cluster, workers)
        watchers = {id(w): w for w in (watcher_for(c.transport) for c in owned)}.values()
        polls_before = sum(w.polls for w in watchers)
        slurm.calls.clear()
        await asyncio.sleep(seconds)
        calls = list(slurm.calls)
        polls = sum(w.polls for w in watchers) - polls_before
        jobs = sum(1 + len(c.workers.active()) for c in owned)
        for cluster in owned:
            await cluster.close_async()
    minutes = seconds / 60
    return {
        "jobs": jobs,
        "watcher polls": polls,
        "Slurm calls": len(calls),
        "Slurm calls per poll": len(calls) / polls if polls else float("nan"),
        "Slurm calls per min": len(calls) / minutes,
    }


async def main(seconds: float) -> None:
    figures: dict[str, dict[str, float]] = {}
    print(f"Slurm calls in steady state, {seconds:g} s per run (kernels poll every 15 s)")
    print(f"{'clusters':>9} {'jobs':>5} {'polls':>6} {'calls':>6} {'per poll':>9} {'per min':>8}")
    for clusters in (1, 10):
        for workers in (0, WORKER_JOBS):
            run = await scenario(clusters, workers, seconds)
            label = f"{clusters} clusters x {1 + workers} jobs"
            figures[label] = run
            print(
                f"{clusters:9d} {run['jobs']:5.0f} {run['watcher polls']:6.0f} "
                f"{run['Slurm calls']:6.0f} {run['Slurm calls per poll']:9.2f} "
                f"{run['Slurm calls per min']:8.1f}"
            )
    write_result("worker_polls", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args().seconds))
