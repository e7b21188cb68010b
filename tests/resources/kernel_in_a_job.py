"""A notebook kernel's stand-in inside a Slurm job (batchspawner's and Open OnDemand's shape).

Run as the job's own process by tests/test_nested_submission.py: ``python kernel_in_a_job.py
WORK PYTHON SETUP``. It notes the Slurm variables it was given, brings up a 2-node cluster with
the package (``SlurmRayCluster``, Slurm on this node), runs a task on each node through Ray
Client, notes where, then waits (at most 5 minutes) for ``WORK/go`` before ``down()``. Each
step is one JSON line in ``WORK/report.jsonl``; a failure is an ``error`` line.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path

from kernel_common import one_task_per_node, report_to

work, python, setup = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
SLURMS = ("SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "SQUEUE_", "SCANCEL_")


def report(event: str, **fields: object) -> None:
    report_to(work, event, **fields)


def main() -> None:
    from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
    from jupyter_slurm_ray.registry import Registry
    from jupyter_slurm_ray.transport import LocalTransport

    outer = {name: value for name, value in os.environ.items() if name.startswith(SLURMS)}
    report("outer", environ=outer, host=socket.gethostname())
    spec = ClusterSpec(
        nodes=2,
        time="10",
        cpus_per_node=1,
        python=python,
        setup=[setup],
        object_store_memory="200M",
        start_timeout=180,
        owner_timeout=60,
        connect="client",  # about the cluster's own job: tests/test_driver_mode.py has the driver
    )
    cluster = SlurmRayCluster(spec, LocalTransport(), registry=Registry(work / "state"))
    try:
        cluster.up()
        report("up", job_id=cluster.job_id, job_dir=cluster.job_dir, hosts=one_task_per_node())
        deadline = time.monotonic() + 300
        while not (work / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception:
        report("error", error=traceback.format_exc(), job_id=cluster.job_id)
    finally:
        cluster.down()
        report("down", job_id=cluster.job_id, state=str(cluster.state))


if __name__ == "__main__":
    main()
