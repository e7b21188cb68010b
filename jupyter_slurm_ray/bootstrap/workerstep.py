"""The srun step that runs the workers, seen from the head: its command, exit, logs, stop."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from jsr_base import LOG_LINES, short_hostname, tail
from jsr_wire import PROGRAM_DIR, Role, Run, ray_log
from procgroups import die_with_parent, stop_processes
from slurmenv import own_job_environment


def worker_step_cpus(env: dict[str, str]) -> int | None:
    """The fewest CPUs the job has on a worker node (SLURM_JOB_CPUS_PER_NODE, head first)."""
    counts: list[int] = []
    for item in env.get("SLURM_JOB_CPUS_PER_NODE", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    workers = counts[1:] or counts
    return min(workers) if workers else None


#: What srun's task environment says of the step it runs in (the head's step of a ``--here``
#: cluster: one node). Left in, a step started inside it reads them as the allocation's shape
#: (``srun: error: Only allocated 1 nodes asked for 2``); without them srun asks Slurm.
STEP_SHAPE = frozenset(
    {
        "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
        "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
        "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS",
    }
)  # fmt: skip


def worker_step_environment(here: bool) -> dict[str, str]:
    """srun's environment for the worker step: the job's own, and inside a ``--here`` head
    step without that step's shape."""
    env = own_job_environment()
    return {k: v for k, v in env.items() if k not in STEP_SHAPE} if here else env


@dataclass(frozen=True)
class HereWorkers:
    """The worker step of a cluster in the kernel's own allocation: its nodes, its name (the
    head step's, JSR_JOB_ID) and the CPUs of each task (None: srun's default)."""

    hosts: tuple[str, ...]
    name: str
    cpus: int | None


def worker_step_argv(
    srun: str,
    job_dir: Path,
    workers: int,
    env: dict[str, str],
    here: HereWorkers | None = None,
) -> list[str]:
    """One srun step with one bootstrap worker task on every node but this one, or (``here``:
    the cluster runs as steps of the kernel's own allocation) on the cluster's other nodes,
    named after the cluster's steps (so that a cancel finds it too) with their CPUs.

    --export=ALL: a job submitted with --export=NAME,... has SLURM_EXPORT_ENV set, and srun
    would pass on only those names instead of what the setup lines built in the batch shell.
    ``env`` is srun's environment: the job's own, without Slurm input variables from outside
    (slurmenv.py).
    """
    argv = [
        srun, "--overlap", f"--nodes={workers}", f"--ntasks={workers}", "--ntasks-per-node=1",
        "--kill-on-bad-exit=0", "--export=ALL",
    ]  # fmt: skip
    if here is not None:
        argv += [f"--nodelist={','.join(here.hosts)}", f"--job-name={here.name}"]
        cpus = here.cpus
    else:
        argv.append(f"--exclude={env.get('SLURMD_NODENAME', short_hostname())}")
        cpus = worker_step_cpus(env)
    if cpus:
        argv.append(f"--cpus-per-task={cpus}")
    return [*argv, sys.executable, str(job_dir / PROGRAM_DIR), Run.WORKER, str(job_dir)]


class WorkerStep:
    """The running srun step (None until started) and the logs its workers write."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.popen: subprocess.Popen[bytes] | None = None

    def start(
        self, srun: str, job_dir: Path, workers: int, here: HereWorkers | None = None
    ) -> None:
        env = worker_step_environment(here is not None)
        argv = worker_step_argv(srun, job_dir, workers, env, here)
        with open(self.logs / "srun-workers.log", "ab") as log:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def log_lines(self, hosts: Iterable[str] | None = None) -> list[str]:
        """The last lines of the workers' `ray start` logs (of hosts, or all) and of srun."""
        paths = sorted(self.logs.glob(ray_log(Role.WORKER, "*")))
        if hosts is not None:
            paths = [self.logs / ray_log(Role.WORKER, host) for host in hosts]
        lines = [line for path in paths for line in tail(path, 10)]
        return (lines + tail(self.logs / "srun-workers.log", 10))[-LOG_LINES:]

    def ask_to_stop(self) -> None:
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGUSR2)  # srun forwards it to the workers

    def stop(self, deadline: float) -> None:
        """Give the workers time to stop their own Ray, then kill the step if still there."""
        if self.popen is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(max(0.0, deadline - time.monotonic()))
        stop_processes([self.popen.pid], [], time.monotonic() + 0.5)
        self.popen.poll()
