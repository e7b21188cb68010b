"""What is known about one cluster's job: the bootstrap's events and Slurm's latest answers.

The cluster (``cluster.py``) asks this what its status is now; this never acts on the job.
Slurm's silence is remembered with its start, never taken for an end; a job is forgotten
(ended) only after Slurm said several times, positively, that it does not know it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from .bootstrap.jsr_wire import Event, Phase
from .errors import SlurmRayError
from .job.directory import JobDir
from .scheduler.interface import Scheduler
from .scheduler.records import JobInfo
from .slurm.watch import JobNews
from .states import EventSummary, Status, derive_status, last_known_job

FORGOTTEN_AFTER = 3  # answers in a row in which Slurm said it does not know the job
# Events after which Slurm has news too: the job started, or is ending.
_NEWS_FOR_SLURM = frozenset(
    {Event.STOPPED, Event.ERROR, Event.OWNER_GONE, Event.LEASE_STALE, Event.WALLTIME_WARNING}
)


class JobFollower:
    """Events read so far, Slurm's silence, and Slurm's reasons for failed nodes."""

    def __init__(self) -> None:
        self.events = EventSummary()
        self.events_offset = 0
        self.misses = 0  # answers in a row in which Slurm did not know the job
        self.silent_since: float | None = None
        self.notice: str | None = None  # why Slurm or the job dir did not answer
        self.node_reasons: dict[str, str] = {}
        self.news_for_slurm = False  # the last events read say Slurm has news (ask it now)
        # refresh() beside the watcher's poll: both read from the same offset, and each event
        # was taken in twice (seen: a test that waited for exactly two `worker_draining` events
        # never counted two)
        self._reading = asyncio.Lock()

    async def observe(self, answer: JobNews, job_dir: JobDir, slurm: Scheduler) -> str:
        """Take in one poll's news; returns the job's log tail when it ended badly."""
        await self.read_events(job_dir)
        job = answer.job
        if not answer.fresh:  # Slurm's last answer again: only the events are news
            return ""
        if answer.answered:
            self.silent_since = None
            self.misses = 0 if job is not None else self.misses + 1
        else:
            self.silent_since, self.notice = answer.silent_since, answer.error
        log_tail = ""
        if job is not None and job.is_final:
            if not self.events.error:
                with contextlib.suppress(SlurmRayError):
                    log_tail = await job_dir.logs(job.job_id, None, 20)
            if job.state == "NODE_FAIL" and not self.node_reasons:
                with contextlib.suppress(SlurmRayError):  # while the node is still down
                    self.node_reasons = await slurm.node_reasons(job.nodes)
        return log_tail

    async def read_events(self, job_dir: JobDir) -> None:
        async with self._reading:
            try:
                events, self.events_offset = await job_dir.read_events(self.events_offset)
            except SlurmRayError as exc:
                self.notice = f"cannot read the job's events: {exc}"
                return
            self.events.add(events)
        self.news_for_slurm = any(
            e.get("event") in _NEWS_FOR_SLURM or e.get("phase") == Phase.BOOTSTRAP for e in events
        )

    def status(
        self,
        previous: Status,
        job: JobInfo | None,
        *,
        connected: bool,
        stopping: bool,
        log_tail: str = "",
        stop_notice: str | None = None,
    ) -> Status:
        """The status now: ``job`` None means no news from Slurm (the last view stands)."""
        forgotten = self.misses >= FORGOTTEN_AFTER
        if job is None and previous.job_id is not None and not forgotten:
            job = last_known_job(previous)
        status = derive_status(
            previous,
            job,
            self.events,
            connected=connected,
            stopping=stopping,
            log_tail=log_tail,
            job_forgotten=forgotten,
            node_reasons=self.node_reasons,
        )
        if status.state.is_final:
            return status
        notice = self.notice if self.silent_since is not None else None
        return replace(
            status, slurm_unreachable_since=self.silent_since, notice=stop_notice or notice
        )
