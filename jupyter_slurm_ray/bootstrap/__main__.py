"""The entry point, ``python JOB_DIR/bootstrap head|worker JOB_DIR``; HELP describes the job dir."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = """\
Start, watch and stop a Ray cluster inside a Slurm allocation.

``python JOB_DIR/bootstrap head JOB_DIR`` is the batch step's main process on the first node.
It starts ``ray start --head`` and, at the same moment, one ``srun`` step running
``python JOB_DIR/bootstrap worker JOB_DIR`` on every other node. The client writes into JOB_DIR
before ``sbatch``:

    bootstrap/*.py   this program, run as a directory (its modules import each other top-level)
    bootstrap.json   settings (see Config)          ray_token   token (RAY_AUTH_TOKEN_PATH)
    lease            rewritten by the owner          detached    optional: ignore the lease

and this program writes:

    events.jsonl     one JSON object per line, appended: phase, nodes, ready, error, ...
    head.json        the head's address and ports, for the workers (atomic)
    connection.json  what a client needs to connect, once every node joined (atomic, 0600)
    logs/ray-head-<host>.log, logs/ray-worker-<host>.log, logs/srun-workers.log

Only the standard library is used; Ray is driven through its ``ray`` command, since the
cluster's Python may not have the ray package. ``ray stop`` is never used (it kills every Ray
process of the user on the node): each node stops its own process session and nothing else.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bootstrap",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "role", choices=["head", "worker"], help="head: the batch step; worker: srun tasks"
    )
    parser.add_argument(
        "job_dir", type=Path, help="the cluster's job dir (bootstrap.json, ray_token, ...)"
    )
    args = parser.parse_args(argv)
    job_dir = args.job_dir.resolve()
    sys.dont_write_bytecode = True  # no __pycache__ in the job dir (every node imports these)
    from headrun import HeadRun
    from workerrun import WorkerRun

    run = HeadRun(job_dir) if args.role == "head" else WorkerRun(job_dir)
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
