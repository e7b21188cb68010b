"""Time from ``scale(+2)`` to both new nodes alive, against a fresh 3-node ``up`` (to every node
joined) measured in the same run on the same testbed; and the squeue calls per poll of the
watcher while the scaled cluster (a head and two worker jobs) runs.

Every job takes a whole node (``exclusive``), the nodes are idle before each run, and
times come from the bootstrap's own events (``time.time()`` on this one machine). Each figure
is given in total and "from job start" (the queue left out: on a shared testbed another user's
job of higher priority can hold the worker jobs back; for a fresh up, from its job's first
event; for the scale, from the later worker job's start). The figures
go to a JSON file (benchmarks/results.py). Run on the login node:
    scripts/testbed exec -- /opt/jupyter-slurm-ray/venv/bin/python benchmarks/scale.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from benchmarks.startup import AS_USER, nodes_idle
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.slurm.schedulers import watcher_for
from jupyter_slurm_ray.transport import CommandResult, LocalTransport
from tests.helpers.clusters import cluster_spec

WATCH_WINDOW = 20.0  # seconds the scaled cluster's polls are counted


class CountingTransport(LocalTransport):
    """The user's commands, with the squeue calls counted."""

    def __init__(self) -> None:
        super().__init__(AS_USER)
        self.squeues = 0

    async def run(self, argv: Sequence[str], **kwargs) -> CommandResult:  # type: ignore[no-untyped-def,override]
        self.squeues += bool(argv) and argv[0] == "squeue"
        return await super().run(argv, **kwargs)


def new_cluster(nodes: int, registry: Registry, transport: LocalTransport) -> SlurmRayCluster:
    spec = cluster_spec(nodes=nodes, cpus_per_node=2, exclusive=True)
    return SlurmRayCluster(spec, transport, registry=registry, poll_interval=0.2)


def joined_at(cluster: SlurmRayCluster, count: int, timeout: float = 300) -> float:
    """The bootstrap's time of the first ``nodes`` event with ``count`` nodes joined."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.refresh()
        for event in cluster.events:
            if event.get("event") == "nodes" and event.get("joined") == count:
                return float(event["t"])
        time.sleep(0.2)
    raise TimeoutError(f"{count} nodes did not join")


def run_fresh(registry: Registry) -> dict[str, float]:
    """``up()`` of 3 nodes to every node joined (and the part of it after the job started)."""
    nodes_idle(timeout=900)  # the testbed is shared: wait for it
    cluster = new_cluster(3, registry, LocalTransport(AS_USER))
    started = time.time()
    try:
        cluster.up(connect=False)
        joined = joined_at(cluster, 3)
        job_start = min(float(e["t"]) for e in cluster.events)
        return {"total": joined - started, "from job start": joined - job_start}
    finally:
        cluster.down()


def run_scale(registry: Registry) -> dict[str, float]:
    """A 1-node cluster, then ``scale(3)`` to both worker jobs' nodes alive; then the squeue
    calls per watcher poll over WATCH_WINDOW s."""
    nodes_idle(timeout=900)  # the testbed is shared: wait for it
    transport = CountingTransport()
    cluster = new_cluster(1, registry, transport)
    try:
        cluster.up(connect=False)
        started = time.time()
        cluster.scale(3)
        joined = joined_at(cluster, 3)
        last_start = max(
            float(e["t"]) for e in cluster.events if e.get("event") == "worker_job_started"
        )
        watcher = watcher_for(transport)
        polls, squeues = watcher.polls, transport.squeues
        time.sleep(WATCH_WINDOW)
        per_poll = (transport.squeues - squeues) / max(1, watcher.polls - polls)
        return {
            "total": joined - started,
            "from job start": joined - last_start,
            "squeue calls per poll": per_poll,
        }
    finally:
        cluster.down()


def main(repeats: int) -> None:
    registry = Registry(Path(tempfile.mkdtemp(prefix="jsr-bench-")))
    fresh: list[dict[str, float]] = []
    scaled: list[dict[str, float]] = []
    for _ in range(repeats):  # interleaved: both see the same machine
        fresh.append(run_fresh(registry))
        scaled.append(run_scale(registry))
    figures: dict[str, object] = {}
    print(f"medians of {repeats} interleaved runs (from job start: queue time left out)")
    for part in ("total", "from job start"):
        fresh_median = statistics.median(r[part] for r in fresh)
        scale_median = statistics.median(r[part] for r in scaled)
        print(f"  {part}: fresh 3-node up -> all joined  {fresh_median:6.1f} s")
        print(f"  {part}: scale(+2) -> both nodes alive  {scale_median:6.1f} s")
        print(f"  {part}: ratio scale / fresh            {scale_median / fresh_median:6.2f}")
        key = part.replace(" ", "_")
        figures[f"fresh_up_3_nodes_{key}_s"] = fresh_median
        figures[f"scale_plus_2_{key}_s"] = scale_median
        figures[f"ratio_{key}"] = scale_median / fresh_median
    per_poll = max(r["squeue calls per poll"] for r in scaled)
    print(f"  squeue calls per poll (head + 2 worker jobs)  {per_poll:6.2f}")
    figures["squeue_calls_per_poll_3_jobs"] = per_poll
    figures["runs"] = {"fresh": fresh, "scale": scaled}
    write_result("scale", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    main(parser.parse_args().repeats)
