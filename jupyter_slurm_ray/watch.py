"""Watching many Slurm jobs with one batched query per poll, shared by a process's clusters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable

from .errors import SlurmRayError
from .slurm import JobInfo, SlurmClient
from .transport import Transport

log = logging.getLogger(__name__)

Callback = Callable[[JobInfo | None], Awaitable[None]]


class JobWatcher:
    """Polls Slurm for all subscribed jobs at once and hands each subscriber its job's info."""

    def __init__(self, slurm: SlurmClient, interval: float = 1.0) -> None:
        self.slurm = slurm
        self.interval = interval
        self._subscribers: dict[str, list[Callback]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self.polls = 0

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
        try:
            infos = await self.slurm.query(job_ids)
        except SlurmRayError as exc:
            log.warning("polling Slurm failed (will retry): %s", exc)
            return
        for job_id in job_ids:
            for callback in list(self._subscribers.get(job_id, [])):
                try:
                    await callback(infos.get(job_id))
                except Exception:  # one broken observer must not stop the watch of others
                    log.exception("updating the watcher of job %s failed", job_id)

    async def _run(self) -> None:
        while self._subscribers:
            await self.poll_once()
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.interval)


_watchers: weakref.WeakKeyDictionary[Transport, JobWatcher] = weakref.WeakKeyDictionary()


def watcher_for(transport: Transport, interval: float = 1.0) -> JobWatcher:
    """The one watcher of a transport (created on first use, on the running loop)."""
    watcher = _watchers.get(transport)
    if watcher is None:
        watcher = JobWatcher(SlurmClient(transport), interval)
        _watchers[transport] = watcher
    watcher.interval = min(watcher.interval, interval)
    return watcher
