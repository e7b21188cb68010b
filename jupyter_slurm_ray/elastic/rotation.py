"""Walltime rotation of worker jobs (issue 9): a worker job whose walltime ends well before the
head's is replaced before it ends, and drained once its replacement joined.

Worker groups may have shorter walltimes than the head (short jobs start sooner on a busy
site). With ``worker_rotation = S`` (seconds), a joined worker job with at most S seconds left,
whose end comes more than S seconds before the head's, gets one replacement of its group
(submitted then, so it can wait in the queue and join before the old one's walltime warning);
the old one is drained through Ray once the replacement joined, like a scale-in. Each move is
a ``rotated`` event with its cause. Nothing here asks Slurm anything: the worker jobs' time
left comes with the cluster's one ``squeue`` per poll.
"""

from __future__ import annotations

from collections.abc import Iterable

from .workerjob import WorkerJob


def due_for_rotation(
    jobs: Iterable[WorkerJob], now: float, lead: float, head_ends_at: float | None
) -> list[WorkerJob]:
    """The joined worker jobs to replace now: at most ``lead`` s left, not yet replaced, and
    ending more than ``lead`` s before the head (a replacement could not outlive the head)."""
    due = []
    for job in jobs:
        if not job.joined or job.leaving or job.replaced_by or job.ends_at is None:
            continue
        if job.ends_at - now > lead:
            continue
        if head_ends_at is not None and head_ends_at - job.ends_at <= lead:
            continue
        due.append(job)
    return due


def replaced_and_joined(jobs: dict[str, WorkerJob]) -> list[WorkerJob]:
    """The worker jobs whose replacement joined: to drain now."""
    return [
        job
        for job in jobs.values()
        if job.replaced_by
        and not job.ended
        and not job.leaving
        and (replacement := jobs.get(job.replaced_by)) is not None
        and replacement.joined
    ]


def rotation_cause(job: WorkerJob, now: float) -> str:
    left = max(0, int((job.ends_at or now) - now))
    return f"worker job {job.job_id} ({job.group}) ends in {left} s, before the head"
