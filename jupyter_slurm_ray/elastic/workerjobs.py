"""A cluster's extra worker jobs: submitted to scale out, drained and cancelled to scale in.

``WorkerJobs`` owns them: which exist, what Slurm and their own events say about each, and
the moves a policy can make (:class:`Moves`): ``submit`` (n more one-node jobs) and ``retire``
(pending jobs cancelled at once; running ones drained through Ray, and cancelled once the
drain timed out). Manual scaling (``SlurmRayCluster.scale``), the adaptive policy (elastic/adapt.py)
and walltime rotation decide which.

Every change of worker jobs (a scale, adapt's decisions, a rotation, the end of a drain,
``cancel_all``) is one *move*, run by :meth:`WorkerJobs.exclusively` under one lock: a move
decides on what the one before it left, an sbatch is never killed half way (a caller cancelled
meanwhile is told once its job is recorded), the job of an sbatch whose answer was lost is
adopted by its tag, and ``cancel_all`` (down, the head's end) waits for the move under way and
cancels what it queued. Drains are seen out after their move, so the lock is never held for
a drain's duration.

A worker job is one node of the head's shape (``jobscript.render_job_script(..., worker=True)``),
tagged ``jupyter-slurm-ray-worker:<cluster id>``, running ``bootstrap workerjob`` (see its
``workerjob.py``): it joins the head with its own port block and leaves by itself when the
head or the owner is gone. Its events go to the cluster's ``events.jsonl`` with ``worker_job``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict
from typing import Any, TypeVar

from ..bootstrap.jsr_wire import WORKER_JOB_FIELD, Event, Run
from ..errors import (
    SlurmRayError,
    SpecError,
)
from ..job.directory import JobDir, probe_site
from ..job.packs import bootstrap_python
from ..job.script import render_job_script
from ..scheduler.interface import Scheduler
from ..scheduler.records import JobInfo
from ..slurm.watch import JobNews, JobWatcher
from ..spec import ClusterSpec
from ..spec.groups import DEFAULT_GROUP, group_spec
from ..states import WorkerJobStatus
from ..transport import Transport
from .moves import Moves
from .workerjob import WorkerJob

log = logging.getLogger(__name__)

WORKER_SCRIPT = "workers.sbatch"


def worker_script_name(group: str) -> str:
    """The file, in the job dir, of a group's worker job script."""
    return WORKER_SCRIPT if group == DEFAULT_GROUP else f"workers-{group}.sbatch"


FORGOTTEN_AFTER = 3  # answers in a row without the job: Slurm forgot it (it ended)
Callback = Callable[[JobNews], Awaitable[None]]
T = TypeVar("T")


def checked_node_count(nodes: object, minimum: int) -> int:
    """``nodes`` as a total node count of at least ``minimum``; SpecError naming ``nodes``."""
    allowed = f"a whole number of Ray nodes in all, at least {minimum}" + (
        " (the head's allocation)" if minimum else ""
    )
    if isinstance(nodes, bool) or not isinstance(nodes, int):
        if isinstance(nodes, str) and nodes.strip().isdigit():
            nodes = int(nodes.strip())
        else:
            raise SpecError("nodes", nodes, allowed)
    if nodes < minimum:
        raise SpecError("nodes", nodes, allowed)
    return nodes


class WorkerJobs:
    """The worker jobs of one cluster, and the moves that change them."""

    def __init__(
        self, transport: Transport, slurm: Scheduler, cluster_id: str, spec: ClusterSpec
    ) -> None:
        self.transport = transport
        self.slurm = slurm
        self.cluster_id = cluster_id
        self.spec = spec
        self.jobs: dict[str, WorkerJob] = {}
        self._site_exported: tuple[str, ...] | None = None  # the job's variables (probed)
        self._script_text: dict[str, str] = {}  # group -> what its script holds now
        self._callbacks: dict[str, Callback] = {}  # job id -> its watcher subscription
        self._misses: dict[str, int] = {}  # answers in a row in which Slurm did not know it
        self._lock = asyncio.Lock()  # one change of worker jobs at a time (exclusively)
        self._moves = Moves(self)
        self.stopped = False  # cancel_all began: no change after it
        self._following: tuple[JobWatcher, Callable[[], None], float] | None = None

    # -- what is known --------------------------------------------------------------------
    def active(self, group: str | None = None) -> list[WorkerJob]:
        """Jobs that count toward the wanted nodes (of ``group``): not ended, not leaving."""
        return [
            job
            for job in self.jobs.values()
            if not job.ended and not job.leaving and group in (None, job.group)
        ]

    def live_ids(self) -> list[str]:
        """Jobs Slurm may still run (to watch, or to cancel)."""
        return [job.job_id for job in self.jobs.values() if not job.ended]

    @property
    def wanted(self) -> int:
        return len(self.active())

    def views(self) -> tuple[WorkerJobStatus, ...]:
        return tuple(job.view() for job in self.jobs.values() if not job.ended)

    def to_record(self) -> list[dict[str, Any]]:
        return [asdict(job) for job in self.jobs.values()]

    def load_record(self, items: Iterable[Any]) -> None:
        for item in items:
            job = WorkerJob.from_dict(item) if isinstance(item, Mapping) else None
            if job is not None:
                self.jobs[job.job_id] = job

    def note_answer(self, job_id: str, info: JobInfo | None) -> bool:
        """Slurm's answer about one job (None: Slurm does not know it); True if it changed."""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        before = asdict(job)
        if info is None:
            job.state, job.reason = "ENDED", job.reason or "Slurm no longer knows the job"
        elif info.is_pending and job.joined:
            return False  # an answer older than the job's own events: it joined
        else:
            job.state = info.state
            job.reason = info.reason if info.is_pending or info.is_final else None
            job.host = info.nodes[0] if info.nodes else job.host
            if info.state == "RUNNING" and info.start_time and info.time_limit:
                job.ends_at = info.start_time.timestamp() + info.time_limit
            start = info.start_time if info.is_pending else None
            job.estimated_start = start.strftime("%Y-%m-%d %H:%M") if start else None
        return asdict(job) != before

    def note_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        """The worker jobs' own events (those with ``worker_job``)."""
        for event in events:
            job = self.jobs.get(str(event.get(WORKER_JOB_FIELD)))
            if job is None:
                continue
            kind = event.get("event")
            if isinstance(event.get("host"), str):
                job.host = event["host"]
            if job.pending:  # its bootstrap runs: Slurm started it (its squeue may say later)
                job.state, job.reason, job.estimated_start = "RUNNING", None, None
            if kind == Event.WORKER_JOINED:
                job.joined = True
            elif kind in (
                Event.WORKER_LEAVING,
                Event.HEAD_GONE,
                Event.OWNER_GONE,
                Event.LEASE_STALE,
            ):
                job.leaving = True
            elif kind in (Event.WORKER_STOPPED, Event.ERROR):
                job.joined = False
                job.leaving = True
                if kind == Event.ERROR:
                    job.reason = str(event.get("reason") or "the worker job failed")

    # -- following them: the cluster's watcher, in the same squeue as the head ----------------
    def follow(self, watcher: JobWatcher, on_change: Callable[[], None], pace: float) -> None:
        """Subscribe every live worker job not yet followed to ``watcher``, and those
        submitted from now on (``on_change`` is called when one is added)."""
        self._following = (watcher, on_change, pace)
        for job_id in self.live_ids():
            if job_id not in self._callbacks:
                callback = self._callback(job_id, watcher, on_change)
                self._callbacks[job_id] = callback
                watcher.watch(job_id, callback, pace=pace, tick=pace)

    def in_transition(self) -> bool:
        """Some worker job is still to join (pending, starting) or on its way out."""
        return any(not job.joined or job.leaving for job in self.active())

    def set_paces(self, watcher: JobWatcher, fast: float, steady: float) -> None:
        """Slurm is asked about a joined worker job as seldom as about a ready head (its own
        events tell of changes), about a pending one every few seconds, else often."""
        for job in self.active():
            if job.job_id not in self._callbacks:
                continue
            if job.joined and not job.leaving:
                pace = steady
            elif job.pending:
                pace = max(fast, min(5.0, steady))
            else:
                pace = fast
            watcher.set_pace(job.job_id, pace)

    def unfollow(self, watcher: JobWatcher) -> None:
        """No longer followed (this object is closed): nor are drains seen out (their
        bootstrap stops them at the drain timeout)."""
        self._following = None
        for job_id, callback in list(self._callbacks.items()):
            watcher.unwatch(job_id, callback)
        self._callbacks.clear()
        self._moves.stop_seeing_out()

    def _callback(
        self, job_id: str, watcher: JobWatcher, on_change: Callable[[], None]
    ) -> Callback:
        async def on_answer(answer: JobNews) -> None:
            if not (answer.fresh and answer.answered):
                return
            misses = 0 if answer.job is not None else self._misses.get(job_id, 0) + 1
            self._misses[job_id] = misses
            if answer.job is None and misses < FORGOTTEN_AFTER:
                return
            if self.note_answer(job_id, answer.job):
                on_change()
            if self.jobs[job_id].ended:
                watcher.unwatch(job_id, self._callbacks.pop(job_id, on_answer))

        return on_answer

    # -- changes: one at a time ---------------------------------------------------------------
    async def exclusively(
        self, move: Callable[[Moves], Awaitable[T]], *, stopping: bool = False
    ) -> T:
        """Run ``move`` as the only change of worker jobs under way: every change (a scale,
        adapt's decisions, a rotation, the end of a drain, :meth:`cancel_all`) waits for the one
        before it, and decides on what that one left. ``move`` changes worker jobs only through
        the :class:`Moves` it is given. An sbatch whose answer was lost is looked up by the
        jobs' tag first. Refused once :meth:`cancel_all` began (the cluster stops), unless
        ``stopping``."""
        self._refuse_when_stopped(stopping)
        async with self._lock:
            self._refuse_when_stopped(stopping)
            await self._moves.adopt_unknown()
            return await move(self._moves)

    def _refuse_when_stopped(self, stopping: bool) -> None:
        if self.stopped and not stopping:
            raise SlurmRayError(
                f"the worker jobs of {self.cluster_id} are being cancelled (the cluster stops)"
            )

    async def cancel_all(self) -> None:
        """Every worker job Slurm may still run is cancelled (the head ended, or down): after
        the change under way, so that what an sbatch in flight queued is cancelled too; no
        change is made after it."""
        self.stopped = True
        await self.exclusively(lambda moves: moves.cancel(list(self.jobs.values())), stopping=True)

    async def until_ended(self, ids: Iterable[str]) -> None:
        """Wait until the drains of these worker jobs are over (see ``Moves.retire``)."""
        await self._moves.until_ended(ids)

    def draining(self) -> list[str]:
        """The worker jobs being drained now (asked to leave, not ended yet)."""
        return self._moves.draining()

    def to_retire(self, count: int, group: str | None = None) -> list[WorkerJob]:
        """Which jobs (of ``group``) go first: pending ones (newest first), then running ones
        (newest first)."""
        newest = sorted(self.active(group), key=lambda job: job.submitted_at, reverse=True)
        return ([j for j in newest if j.pending] + [j for j in newest if not j.pending])[:count]

    def add(self, job_id: str, group: str) -> None:
        """A worker job just queued, followed at once (its record and status show it)."""
        self.jobs[job_id] = WorkerJob(job_id, submitted_at=time.time(), group=group)
        if self._following is not None:
            self.follow(*self._following)
        self.changed()

    def changed(self) -> None:
        """A move changed them: the cluster's status and record show it now."""
        if self._following is not None:
            self._following[1]()

    async def script(self, job_dir: str, minutes: int | None, group: str) -> str:
        """A group's worker job script: its text, for sbatch's stdin (no window to swap it by
        path), and its copy in the job dir as the record, written again when it changes (their
        walltime: the group's, at most the head's time left; the site is probed once)."""
        directory = JobDir(self.transport, job_dir)
        if self._site_exported is None:
            self._site_exported = (
                await probe_site(self.transport, self.spec.job_dir_root, self.spec.export_env)
            ).exported
        spec = group_spec(self.spec, group)
        own = spec.time_seconds
        if minutes is not None and (own is None or minutes * 60 < own):
            spec = spec.replace(time=str(minutes))
        command = directory.bootstrap_command(bootstrap_python(self.spec), Run.WORKER_JOB)
        text = render_job_script(
            spec,
            cluster_id=self.cluster_id,
            job_dir=directory.path,
            command=command,
            exported=self._site_exported,
            worker=True,
        )
        path = directory.file(worker_script_name(group))
        if text != self._script_text.get(group):
            await self.transport.write_file(path, text, 0o600)
            self._script_text[group] = text
        return text
