"""A notebook kernel's stand-in inside a Slurm job, connected in driver mode, running the code
its test sends.

Run as the job's own process by tests/test_placement_groups.py (through
tests/helpers/notebookjob.py): ``python kernel_driver_runs_workloads.py WORK PYTHON SETUP SPEC``
with SPEC a JSON object of ClusterSpec settings. It brings up that cluster with
``connect="driver"``, reports ``up`` (how it connected), then runs each ``WORK/run-NAME.py`` that
appears, once, as a cell would (the code sees ``ray``, ``json``, ``socket``; what it prints is
reported as ``ran`` with its NAME), until ``WORK/go`` (at most 10 minutes): then ``down()``.
Each step is one JSON line in ``WORK/report.jsonl``; a failure is an ``error`` line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from kernel_common import report_to

work, python, setup, settings = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]


def report(event: str, **fields: object) -> None:
    report_to(work, event, **fields)


def run(name: str, code: str) -> None:
    """``code`` as a cell runs it: its own namespace, its output kept."""
    import ray

    printed = io.StringIO()
    cell = {"__name__": f"cell_{name}", "ray": ray, "json": json, "socket": socket}
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"run-{name}.py", "exec"), cell)
    except Exception:
        report("ran", name=name, output=printed.getvalue(), error=traceback.format_exc())
    else:
        report("ran", name=name, output=printed.getvalue())


def serve() -> None:
    """Run each request once, in the order they come, until ``WORK/go``."""
    done: set[str] = set()
    deadline = time.monotonic() + 600
    while not (work / "go").exists() and time.monotonic() < deadline:
        for path in sorted(work.glob("run-*.py")):
            name = path.stem.removeprefix("run-")
            if name not in done:
                done.add(name)
                run(name, path.read_text())
        time.sleep(0.2)


def main() -> None:
    from jupyter_slurm_ray import ClusterSpec, SlurmRayCluster
    from jupyter_slurm_ray.registry import Registry
    from jupyter_slurm_ray.transport import LocalTransport
    from jupyter_slurm_ray.ui.formatting import status_line

    report("outer", host=socket.gethostname(), pid=os.getpid(), job=os.environ["SLURM_JOB_ID"])
    spec = ClusterSpec(python=python, setup=[setup], connect="driver", **json.loads(settings))
    cluster = SlurmRayCluster(spec, LocalTransport(), registry=Registry(work / "state"))
    try:
        cluster.up()
        report(
            "up",
            job_id=cluster.job_id,
            job_dir=cluster.job_dir,
            connect_mode=cluster.status.connect_mode,
            status=status_line(cluster.status),
        )
        serve()
    except Exception:
        report("error", error=traceback.format_exc(), job_id=cluster.job_id)
    finally:
        status = cluster.down()
        report("down", job_id=cluster.job_id, job_dir=cluster.job_dir, state=str(status.state))


if __name__ == "__main__":
    main()
