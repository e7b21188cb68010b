"""Watching many Slurm jobs with one batched query per poll, shared by a process's clusters.

Every poll gives each subscriber a :class:`Answer`: what Slurm said about its job, or that
Slurm did not answer (and since when). The watch itself never dies: any failure is logged,
reported to the subscribers, and the next poll comes as usual (more slowly while Slurm is
silent, so a struggling controller is not hammered).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .errors import SlurmUnavailable
from .slurm import JobInfo, SlurmClient
from .transport import Transport

log = logging.getLogger(__name__)

MAX_SILENT_INTERVAL = 10.0  # seconds between polls while Slurm does not answer
SLOW_ANSWER = 5.0  # seconds without an answer after which the silence is reported


@dataclass(frozen=True)
class Answer:
    """One poll's news about one job.

    ``answered``: Slurm answered; then ``job`` None means it positively does not know the job.
    Otherwise ``job`` is None, ``silent_since`` says since when Slurm has not answered, and
    ``error`` why (the last failure).
    """

    job: JobInfo | None
    answered: bool = True
    silent_since: float | None = None
    error: str | None = None


Callback = Callable[[Answer], Awaitable[None]]


class JobWatcher:
    """Polls Slurm for all subscribed jobs at once and hands each subscriber its answer."""

    def __init__(self, slurm: SlurmClient, interval: float = 1.0) -> None:
        self.slurm = slurm
        self.interval = interval
        self._subscribers: dict[str, list[Callback]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self.polls = 0
        self.silent_since: float | None = None

    def watch(self, job_id: str, callback: Callback) -> None:
        self._subscribers.setdefault(job_id, []).append(callback)
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def unwatch(self, job_id: str, callback: Callback) -> None:
        callbacks = self._subscribers.get(job_id, [])
        with contextlib.suppress(ValueError):
            callbacks.remove(callback)
        if not callbacks:
            self._subscribers.pop(job_id, None)

    def poll_soon(self) -> None:
        """Skip the rest of the current wait (after a submit or a cancel)."""
        self._wakeup.set()

    async def poll_once(self) -> None:
        job_ids = list(self._subscribers)
        if not job_ids:
            return
        self.polls += 1
        asked = time.time()
        query = asyncio.ensure_future(self.slurm.query(job_ids))
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
            answers = dict.fromkeys(job_ids, self._silent(str(exc)))
        except Exception as exc:  # a bug or an unexpected answer: report it, keep watching
            self.silent_since = self.silent_since or asked
            log.exception("polling Slurm failed")
            answers = dict.fromkeys(job_ids, self._silent(f"watching Slurm failed: {exc!r}"))
        else:
            self.silent_since = None
            answers = {job_id: Answer(infos.get(job_id)) for job_id in job_ids}
        await self._deliver(answers)

    def _silent(self, error: str) -> Answer:
        return Answer(None, answered=False, silent_since=self.silent_since, error=error)

    async def _deliver(self, answers: dict[str, Answer]) -> None:
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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self._next_interval())

    def _next_interval(self) -> float:
        if self.silent_since is None:
            return self.interval
        silent_for = time.time() - self.silent_since
        return min(MAX_SILENT_INTERVAL, max(self.interval, silent_for / 4))


_watchers: weakref.WeakKeyDictionary[Transport, JobWatcher] = weakref.WeakKeyDictionary()


def watcher_for(transport: Transport, interval: float = 1.0) -> JobWatcher:
    """The one watcher of a transport (created on first use, on the running loop)."""
    watcher = _watchers.get(transport)
    if watcher is None:
        watcher = JobWatcher(SlurmClient(transport), interval)
        _watchers[transport] = watcher
    watcher.interval = min(watcher.interval, interval)
    return watcher
