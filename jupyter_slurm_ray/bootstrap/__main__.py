"""The entry point, ``python JOB_DIR/bootstrap head|worker|workerjob|driver JOB_DIR``; HELP
describes the job dir."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from jsr_wire import Run


def _warned_early(_signum: int, _frame: object) -> None:
    """Slurm's walltime warning before the node's handlers (noderun.py), which count it."""
    os.environ["JSR_WALLTIME_WARNED"] = "1"


signal.signal(signal.SIGUSR1, _warned_early)  # first: the job script ignores it until now

HELP = """\
Start, watch and stop a Ray cluster inside a Slurm allocation.

``python JOB_DIR/bootstrap head JOB_DIR`` is the batch step's main process on the first node.
It starts ``ray start --head`` and, at the same moment, one ``srun`` step running
``python JOB_DIR/bootstrap worker JOB_DIR`` on every other node. The client writes into JOB_DIR
before ``sbatch``:

    bootstrap/*.py   this program, run as a directory (its modules import each other top-level)
    bootstrap.json   settings (see Config)          ray_token   token (RAY_AUTH_TOKEN_PATH)
    lease            rewritten by the owner          detached    optional: ignore the lease

The owner rewrites ``lease`` every renew_every s with one JSON object {"pid", "host", "seq",
"t" (its time.time()), "renew_every"} (older owners: "PID COUNTER"). Before anything starts
(the first thing the bootstrap does after reading its settings), a "t" older than
owner_timeout while the lease file too was last written more than owner_timeout ago (by the
job dir's filesystem's clock) means the owner is gone: nothing is started. When the clocks
disagree or there is no "t", no change within min(owner_timeout, 2 * renew_every + 3) s means
the same. Once started, the cluster stops when the lease did not change for owner_timeout s
(this node's clock).

and this program writes:

    events.jsonl     one JSON object per line, appended: phase, nodes, ready, error, ...
    head.json        the head's address and ports, for the workers (atomic): the GCS once
                     its listener is verified as this job's Ray, the dashboard once its is
    connection.json  what a client needs to connect, once the head answers (atomic, 0600),
                     with "verified": {"uid", "listeners": {name: port}}, the listeners
                     verified as this job's Ray; clients refuse one without it
    ray_token        renewed (0600, atomically) whenever the head gives up a port block

The token goes only to a listener verified as a socket of this node's Ray session
(/proc/net/tcp{,6} inode among the session's /proc/<pid>/fd): the head's dashboard is asked
only then. Ray's GCS and agents take kernel-assigned ports; the block (port_strategy random,
fixed or hash_jobid) holds node_manager, object_manager, client, dashboard, autoscaler_metrics,
dashboard_metrics, then the worker ports. A listener of another uid on a port of the block
before the head is ready loses the block: ports_retry, a new token, another block.
    logs/ray-head-<host>.log, logs/ray-worker-<host>.log, logs/srun-workers.log

Every event line has t (time.time()), event, host and role (head|worker); then:

    phase                phase=bootstrap|ports|head_starting|workers_starting|head_up|
                         waiting_for_nodes|ready|stopping|stopped, with its details
    owner_gone           reason, lease_age (s or null), lease_file_age (s by the filesystem's
                         clock, or null), waited (s): the owner's lease was stale before
                         anything started; the job ends (exit 0) without starting Ray
    port_lock_unavailable  reason: the node's port lock or claim files could not be used
                         (not a plain file, held too long, no lock dir); ports are still
                         probed by binding, the start goes on
    ports_retry          ports, port_names, reason, attempt, attempts, by_uids, new_token,
                         log: a port of the node's block was taken after the probe (Ray's
                         logs said so, or a listener of by_uids appeared there); Ray starts
                         again on another block, the head's with a new token
    head_retry           reason, log, attempt: `ray start --head` gave up in Ray's own 30 s
                         wait for its raylet (a busy node); twice at most, Ray again on
                         another block, with a new token, if start_timeout leaves 20 s (a
                         worker's: worker_retry, twice for that cause, once for any other
                         early exit)
    nodes                joined, wanted, hosts: the set of alive nodes changed
    node_lost            hosts, reason, joined, wanted, log: nodes left after ready
    worker_starting / worker_joined / worker_retry / worker_stopped   (role worker)
    head_ready           joined, wanted: the head answers (connection.json written): clients
                         may connect while the workers still join
    ready                gcs_address, node_count, elapsed: every node joined
    env_pack             prefix, reused, seconds: the job's environment pack is unpacked here
    env_pack_replaced    archive, expected, found: the pack's content is not the one the job
                         was submitted with (sha256): nothing unpacked; an error follows
    walltime_warning, lease_stale (owner_timeout), error (reason, log), stopped
                         (reason, exit_code, killed)

In the kernel's own allocation (mode 'here', bootstrap.json's here_hosts set), the head runs
as a step of that allocation (srun --overlap, started by the client) rather than as a batch
step: its worker step runs on here_hosts' other nodes, named JSR_JOB_ID as the head's step is,
with cpus_per_node CPUs per task; JSR_JOB_ID (the client's id of the steps) replaces
SLURM_JOB_ID as the job's id (temp dirs, port claims, events); the walltime warning comes
walltime_warning s before the allocation's end, which the head asks of squeue every minute;
with here_kernel_tasks false the head's Ray runs no tasks (0 CPUs, 0 GPUs).

A worker job (``python JOB_DIR/bootstrap workerjob JOB_DIR``: one extra Slurm job of one node
that the client submits to scale out) joins the running head as a worker does; every event it
writes carries worker_job (its Slurm job id). It ends by itself when the owner's lease is stale,
when head.json stays missing for HEAD_GONE_AFTER s (the head ended), or when the client asks it
to drain (the file drain-<job id> in JOB_DIR): it then asks Ray to drain its node (`ray
drain-node`: no new tasks; the raylet exits once idle), waits up to the drain timeout, stops.

    worker_job_started   nodes: the worker job's batch step started
    head_gone            reason: the head is not there (before or after joining); nothing kept
    worker_leaving       reason, ip: this node leaves on purpose (drain, head gone, lease)
    worker_draining      ip, node_id, accepted, timeout: Ray was asked to drain this node

A driver (``python JOB_DIR/bootstrap driver JOB_DIR --owner-pid PID --ray RAY``, run by a
notebook kernel on its own host, as its child: driver mode) makes that host a Ray node that
runs no tasks (--num-cpus=0 --num-gpus=0, no slurm_ray_node: the head does not count it),
with RAY, the kernel's own ray, its own port block and temp dir; once joined it prints one JSON
line on stdout ({"driver": "ready", "ip", "temp_dir", "gcs_address", ...}) and the kernel
connects as a Ray driver through it. It stops when PID is no longer its parent, on SIGTERM, or
when head.json stays missing for 15 s. Its events (role driver):

    driver_starting / driver_joined / driver_retry / driver_stopped / driver_failed

Before reading bootstrap.json, the job dir and each parent must belong to this user or root
and be writable by no one else, through their mode or an ACL (root's sticky dirs such as /tmp
excepted), else: error. The same holds for the environment pack's directory.
Ports are claimed under a lock in bootstrap.json's lock_dir (a real directory; the site's or
user's choice), else in /tmp/jupyter-slurm-ray-ports if root provides it (owned by root,
sticky), else in the private /tmp/jsr-<uid>/ports (/var/tmp/jsr-<uid>/ports when the job's
/tmp is its own: the user's other jobs on the node must see them); only believable claims are
honoured.

Only the standard library is used; Ray is driven through its ``ray`` command, since the
cluster's Python may not have the ray package. ``sitepath/`` goes first on the PYTHONPATH of
Ray's processes: it defers a costly import, and makes Ray Client's proxier connect to a
client's own server only once every listener on its port is that server's (jsr_clientguard).
``ray stop`` is never used (it kills every Ray process of the user on the node): each node
stops its own process session and nothing else.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bootstrap",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "role",
        choices=[Run.HEAD, Run.WORKER, Run.WORKER_JOB, Run.DRIVER],
        help="head: the batch step; worker: srun tasks; workerjob: a worker job's batch step; "
        "driver: a notebook kernel's host",
    )
    parser.add_argument(
        "job_dir", type=Path, help="the cluster's job dir (bootstrap.json, ray_token, ...)"
    )
    parser.add_argument("--owner-pid", type=int, help="driver: stop once this is not the parent")
    parser.add_argument("--ray", help="driver: the kernel's own `ray` command")
    args = parser.parse_args(argv)
    job_dir = args.job_dir.resolve()
    sys.dont_write_bytecode = True  # no __pycache__ in the job dir (every node imports these)
    if args.role == Run.DRIVER:
        from driverrun import DriverRun

        return DriverRun(job_dir, args.owner_pid, args.ray).run()
    from headrun import HeadRun
    from workerjob import WorkerJobRun
    from workerrun import WorkerRun

    runs = {Run.HEAD: HeadRun, Run.WORKER: WorkerRun, Run.WORKER_JOB: WorkerJobRun}
    return runs[args.role](job_dir).run()


if __name__ == "__main__":
    sys.exit(main())
