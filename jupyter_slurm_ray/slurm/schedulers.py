"""Which scheduler runs a cluster's jobs, chosen once: by the cluster's mode for a new cluster
(Slurm's sbatch, local mode's processes of this machine, or steps of the kernel's own
allocation), by the job's id for a known one (``local-<pid>``, ``here-<allocation>-<pid>``, else
Slurm's). A transport only says where the commands run. And the one watcher of a transport
(``watcher_for``), whose query asks each kind for its own jobs."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from ..naming import is_here_job_id
from ..scheduler.interface import Scheduler
from ..scheduler.records import JobInfo
from ..transport import Transport
from .client import SlurmClient
from .heresteps import HereSteps
from .localjobs import LocalJobs, is_local_job_id
from .queuecache import SharedQueue
from .watch import JobWatcher


def scheduler_for_mode(
    mode: str, transport: Transport, *, shared: SharedQueue | None = None
) -> Scheduler:
    """The scheduler of a new cluster of ``mode`` (``ClusterSpec.mode``)."""
    if mode == "local":
        return LocalJobs(transport)
    if mode == "here":
        return HereSteps(transport, shared=shared)
    return SlurmClient(transport, shared=shared)


def scheduler_of(
    transport: Transport, job_id: str | None, *, shared: SharedQueue | None = None
) -> Scheduler:
    """The scheduler of one job, by its id."""
    if job_id is not None and is_local_job_id(job_id):
        return LocalJobs(transport)
    if is_here_job_id(job_id):
        return HereSteps(transport, shared=shared)
    return SlurmClient(transport, shared=shared)


async def query_jobs(
    scheduler: Scheduler, job_ids: Iterable[str], *, max_age: float = 0.0
) -> dict[str, JobInfo]:
    """``scheduler.query`` for jobs of any kind on its transport: local mode's asked of
    ``LocalJobs``; Slurm's and here steps of ``HereSteps`` when there are here steps among
    them (it knows both), else of ``scheduler`` (Slurm's, or the one the jobs are of)."""
    ids = list(job_ids)
    local = [job for job in ids if is_local_job_id(job)]
    others = [job for job in ids if not is_local_job_id(job)]
    answers: dict[str, JobInfo] = {}
    if local:
        answers.update(await _asked(scheduler, LocalJobs, local, max_age))
    if others:
        kind = HereSteps if any(is_here_job_id(job) for job in others) else SlurmClient
        answers.update(await _asked(scheduler, kind, others, max_age))
    return answers


async def _asked(
    scheduler: Scheduler, kind: type[Scheduler], job_ids: list[str], max_age: float
) -> dict[str, JobInfo]:
    """``job_ids`` asked of a ``kind`` (the scheduler itself when it is one: a here cluster's
    ``HereSteps`` knows Slurm's jobs too) on the scheduler's transport, counted as its own."""
    if isinstance(scheduler, kind) or (kind is SlurmClient and isinstance(scheduler, HereSteps)):
        return await scheduler.query(job_ids, max_age=max_age)
    shared = getattr(scheduler, "shared", None)
    other: Scheduler
    if kind is LocalJobs:
        other = LocalJobs(scheduler.transport, timeout=scheduler.timeout)
    elif kind is HereSteps:
        other = HereSteps(scheduler.transport, timeout=scheduler.timeout, shared=shared)
    else:
        other = SlurmClient(scheduler.transport, timeout=scheduler.timeout, shared=shared)
    try:
        return await other.query(job_ids, max_age=max_age)
    finally:
        scheduler.commands_run += other.commands_run


_watchers: weakref.WeakKeyDictionary[Transport, JobWatcher] = weakref.WeakKeyDictionary()


def watcher_for(
    transport: Transport, interval: float = 1.0, shared_dir: Path | None = None
) -> JobWatcher:
    """The one watcher of a transport (created on first use, on the running loop). With
    ``shared_dir`` (the user's state dir), its queries share the user's queue on this host."""
    watcher = _watchers.get(transport)
    if watcher is None:
        first = SlurmClient(transport)
        watcher = JobWatcher(first, interval, partial(_query_jobs, first))
        _watchers[transport] = watcher
    slurm = watcher.slurm  # the SlurmClient made above: its queue may be shared from now on
    if shared_dir is not None and isinstance(slurm, SlurmClient) and slurm.shared is None:
        slurm.shared = SharedQueue(shared_dir, transport.target)
    watcher.interval = min(watcher.interval, interval)
    return watcher


async def _query_jobs(
    scheduler: Scheduler, job_ids: list[str], max_age: float
) -> dict[str, JobInfo]:
    return await query_jobs(scheduler, job_ids, max_age=max_age)
