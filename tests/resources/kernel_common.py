"""What the notebook kernels' stand-ins in tests/resources share (kernel_in_a_job.py,
kernel_here.py, kernel_driver_in_a_job.py, kernel_driver_runs_workloads.py): their report
lines and a task on each of the cluster's nodes. They run as programs inside a Slurm job, so
this directory is their first sys.path entry and they import it by its plain name."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path


def report_to(work: Path, event: str, **fields: object) -> None:
    """One JSON line in ``work/report.jsonl``, which the test reads."""
    with open(work / "report.jsonl", "a") as handle:
        handle.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def one_task_per_node() -> list[str]:
    """The hosts of a task pinned to each of the cluster's Ray nodes (those with the
    slurm_ray_node resource: not the kernel's own node of driver mode), sorted."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

    @ray.remote(num_cpus=0)
    def where() -> str:
        return socket.gethostname()

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "slurm_ray_node" in n["Resources"]]
    refs = [where.options(scheduling_strategy=Affinity(n, soft=False)).remote() for n in nodes]
    return sorted(ray.get(refs, timeout=120))
