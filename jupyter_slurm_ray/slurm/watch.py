"""Watching many Slurm jobs with one batched query, as seldom as the jobs allow, shared by a
process's clusters (and, through the shared queue, by the user's other processes).

The watch ticks as often as the watched jobs' *tick* requires (each tick, every subscriber
reads its job's events: cheap, no Slurm involved) and asks Slurm only as often as their *pace*
requires: each cluster sets both from its state (a pending job's first event is awaited every
``interval`` while Slurm is asked every few seconds; fast while starting or stopping; every 15 s
or so once up), and asks for a query at once (``poll_soon``) when its events say something
changed.
Every tick gives each subscriber an :class:`JobNews`: Slurm's news (``fresh``) or the last
ones again, so that it reads its job's events. The watch itself never dies: any failure is
logged, reported to the subscribers, and the next tick comes as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from ..errors import SlurmUnavailable
from ..scheduler.interface import Scheduler
from ..scheduler.records import JobInfo

log = logging.getLogger(__name__)

MAX_SILENT_INTERVAL = 10.0  # seconds between queries while Slurm does not answer
SLOW_ANSWER = 5.0  # seconds without an answer after which the silence is reported
EVENTS_TICK = 5.0  # the slowest tick: a steady cluster's events are read this often


@dataclass(frozen=True)
class JobNews:
    """One tick's news about one job.

    ``answered``: Slurm answered; then ``job`` None means it positively does not know the job.
    Otherwise ``job`` is None, ``silent_since`` says since when Slurm has not answered, and
    ``error`` why (the last failure). ``fresh`` is False when this is the last answer again
    (no query was due this tick).
    """

    job: JobInfo | None
    answered: bool = True
    silent_since: float | None = None
    error: str | None = None
    fresh: bool = True


Callback = Callable[[JobNews], Awaitable[None]]
Query = Callable[[list[str], float], Awaitable[dict[str, JobInfo]]]  # (job ids, max age)


class JobWatcher:
    """Ticks for all subscribed jobs, asks Slurm for all of them at once when due."""

    def __init__(self, slurm: Scheduler, interval: float = 1.0, query: Query | None = None) -> None:
        """``query`` asks for the jobs (``slurm.query`` unless given: ``schedulers.watcher_for``
        gives one that asks for jobs of any kind)."""
        self.slurm = slurm
        self.query: Query = query or (
            lambda job_ids, max_age: slurm.query(job_ids, max_age=max_age)
        )
        self.interval = interval
        self._subscribers: dict[str, list[Callback]] = {}
        self._pace: dict[str, float] = {}  # job -> seconds between Slurm queries it needs
        self._tick: dict[str, float] = {}  # job -> seconds between reads of its events
        self._last: dict[str, JobNews] = {}
        self._asked_at = float("-inf")
        self._force = True
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self.polls = 0  # queries made
        self.silent_since: float | None = None

    async def _ask_slurm(self, job_ids: list[str], max_age: float) -> dict[str, JobInfo]:
        return await self.slurm.query(job_ids, max_age=max_age)

    def watch(
        self, job_id: str, callback: Callback, pace: float | None = None, tick: float | None = None
    ) -> None:
        self._subscribers.setdefault(job_id, []).append(callback)
        self._pace[job_id] = pace or self.interval
        self._tick[job_id] = tick or self._pace[job_id]
        self.poll_soon()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def unwatch(self, job_id: str, callback: Callback) -> None:
        callbacks = self._subscribers.get(job_id, [])
        with contextlib.suppress(ValueError):
            callbacks.remove(callback)
        if not callbacks:
            self._subscribers.pop(job_id, None)
            self._pace.pop(job_id, None)
            self._tick.pop(job_id, None)
            self._last.pop(job_id, None)

    def set_pace(self, job_id: str, seconds: float, tick: float | None = None) -> None:
        """Ask Slurm about ``job_id`` at least every ``seconds``, and give its subscribers a
        tick (to read its events) every ``tick`` seconds (default: as often); its state sets
        both."""
        if job_id in self._subscribers:
            self._pace[job_id] = max(self.interval, seconds)
            self._tick[job_id] = max(self.interval, tick or seconds)
            self._wakeup.set()

    def remember(self, job_id: str, answer: JobNews) -> None:
        """A newer answer about ``job_id`` asked for directly (``refresh()``): the ticks
        between two queries repeat it, not the watcher's own older one."""
        if job_id in self._subscribers and answer.answered:
            self._last[job_id] = answer

    def poll_soon(self) -> None:
        """Ask Slurm on the next tick, now (after a submit, a cancel, news in the events)."""
        self._force = True
        self._wakeup.set()

    @property
    def pace(self) -> float:
        """Seconds between two queries now: the fastest pace any watched job needs."""
        return min(self._pace.values(), default=self.interval)

    async def poll_once(self) -> None:
        job_ids = list(self._subscribers)
        if not job_ids:
            return
        if self._force or time.monotonic() - self._asked_at >= self.pace - 0.05:
            answers = await self._query(job_ids, max_age=0.0 if self._force else self.pace / 2)
            self._last.update(answers)
        else:
            answers = {j: replace(self._last[j], fresh=False) for j in job_ids if j in self._last}
        await self._deliver(answers)

    async def _query(self, job_ids: list[str], max_age: float) -> dict[str, JobNews]:
        self._force = False
        self._asked_at = time.monotonic()
        self.polls += 1
        asked = time.time()
        query = asyncio.ensure_future(self.query(job_ids, max_age))
        try:
            done, _ = await asyncio.wait({query}, timeout=SLOW_ANSWER)
        except asyncio.CancelledError:
            query.cancel()
            raise
        if not done:  # a paused or overloaded controller: say so now, keep waiting
            self.silent_since = self.silent_since or asked
            waiting = f"Slurm has not answered for {SLOW_ANSWER:g} s"
            await self._deliver(dict.fromkeys(job_ids, self._silent(waiting)))
        try:
            infos = await query
        except SlurmUnavailable as exc:
            self.silent_since = self.silent_since or asked
            log.warning("Slurm did not answer (will ask again): %s", exc)
            return dict.fromkeys(job_ids, self._silent(str(exc)))
        except Exception as exc:  # a bug or an unexpected answer: report it, keep watching
            self.silent_since = self.silent_since or asked
            log.exception("polling Slurm failed")
            return dict.fromkeys(job_ids, self._silent(f"watching Slurm failed: {exc!r}"))
        self.silent_since = None
        return {job_id: JobNews(infos.get(job_id)) for job_id in job_ids}

    def _silent(self, error: str) -> JobNews:
        return JobNews(None, answered=False, silent_since=self.silent_since, error=error)

    async def _deliver(self, answers: dict[str, JobNews]) -> None:
        for job_id, answer in answers.items():
            for callback in list(self._subscribers.get(job_id, [])):
                try:
                    await callback(answer)
                except Exception:  # one broken subscriber must not stop the watch of others
                    log.exception("updating the watcher of job %s failed", job_id)

    async def _run(self) -> None:
        while self._subscribers:
            try:
                await self.poll_once()
            except Exception:  # never let the watch die: poll_once already reports
                log.exception("the job watcher failed; it goes on")
            self._wakeup.clear()
            if self._force:
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self._next_tick())

    def _next_tick(self) -> float:
        if self.silent_since is not None:
            silent_for = time.time() - self.silent_since
            return min(MAX_SILENT_INTERVAL, max(self.interval, silent_for / 4))
        tick = min(self._tick.values(), default=self.interval)
        return max(self.interval, min(self.pace, tick, EVENTS_TICK))
