"""Which scheduler runs a cluster's jobs, chosen once: by the cluster's mode for a new cluster,
by the job's id for a known one (``scheduler/kinds.py``: each kind says which ids are its). A
transport only says where the commands run. And the one watcher of a transport
(``watcher_for``), whose query asks each kind for its own jobs."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from ..scheduler.interface import Scheduler
from ..scheduler.kind import SchedulerKind
from ..scheduler.kinds import DEFAULT_MODE, kind_for_mode, kind_of
from ..scheduler.records import JobInfo
from ..transport import Transport
from .queuecache import SharedQueue
from .watch import JobWatcher


def scheduler_for_mode(
    mode: str, transport: Transport, *, shared: SharedQueue | None = None
) -> Scheduler:
    """The scheduler of a new cluster of ``mode`` (``ClusterSpec.mode``)."""
    return operating(kind_for_mode(mode)).create(transport, shared=shared)


def scheduler_of(
    transport: Transport, job_id: str | None, *, shared: SharedQueue | None = None
) -> Scheduler:
    """The scheduler of one job, by its id."""
    return operating(kind_of(job_id)).create(transport, shared=shared)


def operating(kind: type[SchedulerKind]) -> type[Scheduler]:
    """The kind as the scheduler that runs its jobs (every registered kind is one: ``kinds``
    refuses any other)."""
    if not issubclass(kind, Scheduler):
        raise TypeError(f"{kind.__name__} is not a jupyter_slurm_ray Scheduler")
    return kind


async def query_jobs(
    scheduler: Scheduler, job_ids: Iterable[str], *, max_age: float = 0.0
) -> dict[str, JobInfo]:
    """``scheduler.query`` for jobs of any kind on its transport: each kind asked for its own
    jobs, once; a kind that answers for another's too (a --here cluster's, for Slurm's) asks
    for both in one command when both are among them."""
    asked: dict[type[Scheduler], list[str]] = {}
    for job_id in dict.fromkeys(job_ids):
        asked.setdefault(operating(kind_of(job_id)), []).append(job_id)
    for kind in [kind for kind in asked if kind.also_answers]:
        others = [other for other in asked if other.mode in kind.also_answers]
        if kind in asked:  # not merged into another already
            for other in others:
                asked[kind] += asked.pop(other)
    answers: dict[str, JobInfo] = {}
    for kind, ids in asked.items():
        answers.update(await _asked(scheduler, kind, ids, max_age))
    return answers


async def _asked(
    scheduler: Scheduler, kind: type[Scheduler], job_ids: list[str], max_age: float
) -> dict[str, JobInfo]:
    """``job_ids`` asked of a ``kind`` (the scheduler itself when it is one, or answers for
    that kind) on the scheduler's transport, counted as its own."""
    if isinstance(scheduler, kind) or kind.mode in type(scheduler).also_answers:
        return await scheduler.query(job_ids, max_age=max_age)
    shared = getattr(scheduler, "shared", None)
    other = kind.create(scheduler.transport, timeout=scheduler.timeout, shared=shared)
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
        first = scheduler_for_mode(DEFAULT_MODE, transport)
        watcher = JobWatcher(first, interval, partial(_query_jobs, first))
        _watchers[transport] = watcher
    slurm = watcher.slurm  # the scheduler made above: its queue may be shared from now on
    if shared_dir is not None and getattr(slurm, "shared", False) is None:
        slurm.shared = SharedQueue(shared_dir, transport.target)  # type: ignore[attr-defined]
    watcher.interval = min(watcher.interval, interval)
    return watcher


async def _query_jobs(
    scheduler: Scheduler, job_ids: list[str], max_age: float
) -> dict[str, JobInfo]:
    return await query_jobs(scheduler, job_ids, max_age=max_age)
