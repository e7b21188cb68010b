"""A notebook kernel's stand-in inside a Slurm allocation of several nodes, for ``--here``.

Run as the notebook job's own process by tests/test_here.py: ``python kernel_here.py WORK
PYTHON SETUP``. It does what the test asks, one request at a time: the test writes
``WORK/ask-<n>`` holding an action and a newline, the kernel answers with one JSON line in
``WORK/report.jsonl`` carrying ``n`` (an ``error`` line when the action failed). Actions:

- ``refuse``: three requests that do not fit the allocation (more nodes than it has, a GPU it
  does not hold, a partition), each refused before anything starts;
- ``up``: ``SlurmRayCluster(ClusterSpec(mode="here", …))`` up on every node of the allocation,
  one task on each node through Ray Client, where it ran;
- ``down``: the last cluster's ``down()``;
- ``ping``: an answer (the kernel still runs).

It waits at most 10 minutes for the next request, then ends (so does the allocation).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from kernel_common import one_task_per_node, report_to

work, python, setup = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
SPEC = dict(
    mode="here",
    python=python,
    setup=[setup],
    object_store_memory="200M",
    start_timeout=180,
    owner_timeout=60,
)


def report(event: str, **fields: object) -> None:
    report_to(work, event, **fields)


def refuse(registry) -> dict[str, object]:
    """Each request that does not fit, and what was left of it (nothing, it should be)."""
    from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
    from jupyter_slurm_ray.errors import SpecError
    from jupyter_slurm_ray.transport import LocalTransport

    refused = {}
    for name, settings in (
        ("nodes", {"here_nodes": "4"}),
        ("gpus", {"gpus_per_node": 1}),
        ("partition", {"partition": "debug"}),
    ):
        try:
            spec = ClusterSpec(**{**SPEC, **settings})
            SlurmRayCluster(spec, LocalTransport(), registry=registry).up(wait=False)
            refused[name] = None
        except SpecError as exc:
            refused[name] = {"field": exc.field, "message": str(exc)}
    steps = Path.home() / ".jupyter-slurm-ray" / "here-steps"
    left = sorted(p.name for p in steps.glob(f"here-{os.environ['SLURM_JOB_ID']}-*"))
    return {"refused": refused, "records": len(registry.all()), "runner_files": left}


def main() -> None:
    # the package's log and, every 60 s, where each thread is: the test shows notebook.out
    # when the kernel does not answer in time
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    faulthandler.dump_traceback_later(60, repeat=True)
    from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
    from jupyter_slurm_ray.registry import Registry
    from jupyter_slurm_ray.transport import LocalTransport

    registry = Registry(work / "state")
    slurm = {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}
    report("outer", environ=slurm, host=socket.gethostname())
    cluster = None
    asked, deadline = 1, time.monotonic() + 600
    while time.monotonic() < deadline:
        request = work / f"ask-{asked}"
        text = request.read_text() if request.exists() else ""
        if not text.endswith("\n"):  # not there yet, or being written (cat creates it first)
            time.sleep(0.2)
            continue
        action = text.strip()
        try:
            if action == "refuse":
                report(action, n=asked, **refuse(registry))
            elif action == "up":
                spec = ClusterSpec(**SPEC)
                cluster = SlurmRayCluster(spec, LocalTransport(), registry=registry)
                cluster.up()
                where = {"job_dir": cluster.job_dir, "here_nodes": cluster.spec.here_nodes}
                status = cluster.status
                where |= {"connect": [status.connect_mode, status.connect_reason]}
                hosts = one_task_per_node()
                report(action, n=asked, job_id=cluster.job_id, hosts=hosts, **where)
            elif action == "ping":
                report(action, n=asked, host=socket.gethostname())
            elif action == "down" and cluster is not None:
                cluster.down()
                report(action, n=asked, job_id=cluster.job_id, state=str(cluster.state))
            else:
                raise ValueError(f"no such request here: {action!r}")
        except Exception:
            report("error", n=asked, error=traceback.format_exc())
        asked, deadline = asked + 1, time.monotonic() + 600


if __name__ == "__main__":
    main()
