"""Real Slurm jobs on the testbed: submitting a rendered job script, and asking Slurm (as root,
who sees every user's jobs) about a job.

Two views of a job's state, named for what they show:

- :func:`queue_state`: squeue's default view, pending, running or completing; ``""`` as soon as
  the job ended;
- :func:`last_state`: also the end state (COMPLETED, CANCELLED, …) for as long as slurmctld
  remembers the job (MinJobAge, 30 s on the testbed); ``""`` after that.
"""

from __future__ import annotations

import subprocess
import time

from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.transport import Transport

from .testbed import USER, runuser


async def submit_script(transport: Transport, script: str, job_dir: str) -> str:
    """Write ``script`` to ``job_dir/job.sbatch`` (dir 0700) and sbatch it; the job id."""
    await transport.make_dir(job_dir, 0o700)
    path = f"{job_dir}/job.sbatch"
    await transport.write_file(path, script, 0o700)
    return await SlurmClient(transport).submit(path)


def step_in_job(job_id: str, host: str) -> list[str]:
    """argv's start for a step of a running job on one of its nodes, sharing its allocation:
    only such a step sees the job's own /tmp (job_container/tmpfs), where Ray's temp dir is."""
    return ["srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1", f"--nodelist={host}"]


def _squeue(*argv: str, attempts: int = 5) -> str:
    """squeue's answer; ``""`` for a job slurmctld no longer knows. A busy slurmctld may not
    answer in time: asked again, a bounded number of times, never read as "no such job"."""
    for attempt in range(1, attempts + 1):
        done = subprocess.run(["squeue", "-h", *argv], capture_output=True, text=True)
        if done.returncode == 0 or "Invalid job id" in done.stderr:
            return done.stdout.strip()
        if attempt < attempts:
            time.sleep(attempt)
    raise AssertionError(f"squeue {' '.join(argv)} failed {attempts} times: {done.stderr}")


def queue_state(job_id: str) -> str:
    """The job's state while it is queued, running or completing; ``""`` once it ended."""
    return _squeue("-j", job_id, "-o", "%T")


def last_state(job_id: str) -> str:
    """The job's state, its end state included while slurmctld remembers it."""
    return _squeue("-t", "all", "-j", job_id, "-o", "%T")


def end_state(job_id: str, timeout: float = 30.0) -> str:
    """The job's state once it ended: slurmctld's while it remembers the job (MinJobAge), else
    the accounting's (slurmdbd may record the end a moment later); ``""`` if neither knows it
    within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        state = last_state(job_id)
        if state:
            return state
        done = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], capture_output=True, text=True
        )
        words = done.stdout.split()  # "CANCELLED by 1001"
        if words or time.monotonic() > deadline:
            return words[0] if words else ""
        time.sleep(1)


def in_queue(job_id: str) -> bool:
    """squeue still lists the job: pending, running, or completing (its processes ending)."""
    return queue_state(job_id) != ""


def pending_or_running(job_id: str) -> bool:
    """The job is pending or running: neither ended nor completing."""
    return queue_state(job_id) not in ("", "COMPLETING")


def jobs_named(name: str, user: str = USER) -> list[str]:
    """Ids of ``user``'s jobs called ``name``, queued, running or recently ended."""
    out = subprocess.run(
        [*runuser(user), "squeue", "-h", "-t", "all", "-n", name, "-o", "%i"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def jobs_with_comment(comment: str, user: str = USER) -> list[str]:
    """Ids of ``user``'s jobs whose comment is ``comment`` (a cluster's tag, see naming.py),
    queued, running or recently ended."""
    out = subprocess.run(
        [*runuser(user), "squeue", "-h", "-t", "all", "--me", "-o", "%i|%k"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = (line.partition("|") for line in out.splitlines())
    return [job_id for job_id, _, tag in lines if tag.strip() == comment]


def accounted_jobs(name: str, workdir: str, since: float, user: str = USER) -> dict[str, str]:
    """Slurm's accounting (sacct, the allocations) of ``user``'s jobs called ``name`` that run
    in ``workdir`` and that Slurm had (pending, running or ending) at some time after
    ``since`` (a time.time()): job id -> state, e.g. ``CANCELLED by 1001``. (The testbed's
    accounting keeps no job comments: a cluster's jobs are told by their name and their
    directory, the cluster's job dir.)"""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-u", user, "-S", start, "-o", "JobID,JobName,State,WorkDir"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 3]
    return {i: state for i, n, state, d in rows if n == name and d.rstrip("/") == workdir}


def idle_nodes(partition: str) -> int:
    """How many of the partition's nodes are idle (``sinfo`` without ``-p`` would count a node
    once per partition it is in)."""
    out = subprocess.run(
        ["sinfo", "-h", "-p", partition, "-t", "idle", "-o", "%D"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return sum(int(n) for n in out.split() if n.isdigit())


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (Key=Value pairs)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], check=True, capture_output=True, text=True
    ).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def batch_script(job_id: str) -> str:
    """The script Slurm keeps for the job (what sbatch got), while slurmctld knows the job."""
    return subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
