"""What one change of a cluster's worker jobs does: submit, retire (drain), cancel.

A ``Moves`` is handed to a change by ``workerjobs.WorkerJobs.exclusively`` only, under its lock,
so that two changes never interleave. Here:

- an sbatch is never killed half way: it runs in a task of its own, and a caller cancelled
  meanwhile (a cell interrupted, the adapt loop stopped, down) is told once it ended and its job
  is recorded and followed;
- an sbatch whose answer was lost (timed out, the connection dropped, killed as the loop
  closed) leaves its outcome unknown: the cluster's worker jobs are looked up by their tag
  (``jupyter-slurm-ray-worker:<id>``) at once, or before the next change, and the unknown ones
  adopted (``submission.submit_or_adopt`` does the same for the head's job);
- a drain is seen out after its change (the lock is never held for a drain's duration), and
  the jobs still there after the drain timeout and the bootstrap's grace are cancelled as a
  change of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import (
    SlurmError,
    SlurmRayError,
    SlurmUnavailable,
    SubmitOutcomeUnknown,
    TransportError,
)
from ..job.directory import JobDir
from ..spec.groups import DEFAULT_GROUP
from .workerjob import WorkerJob

if TYPE_CHECKING:
    from ..scheduler.interface import Scheduler
    from ..transport import Transport

log = logging.getLogger(__name__)

DRAIN_GRACE = 15.0  # after the drain timeout: the bootstrap's own stop, then scancel
T = TypeVar("T")


class WorkerBook(Protocol):
    """What the moves read and change of a cluster's worker jobs (``workerjobs.WorkerJobs``)."""

    cluster_id: str
    slurm: Scheduler
    transport: Transport
    jobs: dict[str, WorkerJob]
    stopped: bool

    async def script(self, job_dir: str, minutes: int | None, group: str) -> str: ...
    def add(self, job_id: str, group: str) -> None: ...
    def changed(self) -> None: ...
    def active(self, group: str | None = None) -> list[WorkerJob]: ...
    def to_retire(self, count: int, group: str | None = None) -> list[WorkerJob]: ...
    async def exclusively(
        self, move: Callable[[Moves], Awaitable[T]], *, stopping: bool = False
    ) -> T: ...


class Moves:
    """The moves of one cluster's worker jobs; only ever used inside ``exclusively``."""

    def __init__(self, jobs: WorkerBook) -> None:
        self._jobs = jobs
        self._unknown: str | None = None  # the group of an sbatch whose outcome is unknown
        self._drains: dict[str, asyncio.Future[None]] = {}  # job id -> its drain, seen out

    # -- out ---------------------------------------------------------------------------------
    async def submit(
        self, count: int, job_dir: str, minutes: int | None = None, group: str = DEFAULT_GROUP
    ) -> list[str]:
        """``count`` more one-node worker jobs of ``group``, each with a walltime of at most
        ``minutes`` (the head's time left: see ``worker_minutes``; None: the group's); their
        ids (those submitted before a failure are kept, and the error says how many). None
        more once the cluster stops (``cancel_all`` waits for this change)."""
        script = await self._jobs.script(job_dir, minutes, group)
        jobs = "worker jobs" if group == DEFAULT_GROUP else f"worker jobs of group {group}"
        submitted: list[str] = []
        for _ in range(count):
            done = f"submitted {len(submitted)} of {count} {jobs}"
            if self._jobs.stopped:
                raise SlurmRayError(f"{done}; the cluster stops")
            try:
                submitted += await _to_the_end(self._submit_one(script, group))
            except SubmitOutcomeUnknown as exc:
                raise SubmitOutcomeUnknown(f"{done}; {exc}") from None
            except SlurmRayError as exc:
                raise SlurmError(f"{done}; Slurm refused the next: {exc}") from None
        return submitted

    async def _submit_one(self, script: str, group: str) -> list[str]:
        """One sbatch, its job recorded (or the job adopted by its tag when the answer was
        lost). Until the answer comes the outcome counts as unknown, so that a submission killed
        half way is looked up before the next change."""
        self._unknown = group
        try:
            job_id = await self._jobs.slurm.submit(script)
        except SlurmUnavailable:
            raise  # Slurm did not answer: looked up before the next change
        except SlurmError:
            self._unknown = None  # refused: nothing was queued
            raise
        except TransportError as exc:
            system = self._jobs.slurm.system
            adopted = await self.adopt_unknown()
            if adopted is None:
                raise SubmitOutcomeUnknown(
                    f"the next worker job's submission to {system} had no answer ({exc}) and "
                    f"{system} could not be asked about it; it is looked up again before the "
                    "next change (`gc` finds it too)"
                ) from None
            if not adopted:
                raise SlurmError(
                    f"the submission to {system} had no answer ({exc}) and queued no job"
                ) from None
            return adopted
        self._unknown = None
        self._jobs.add(job_id, group)
        return [job_id]

    async def adopt_unknown(self) -> list[str] | None:
        """After a submission of unknown outcome: the cluster's tagged worker jobs this process
        did not know, adopted; None when Slurm could not be asked (looked up again later)."""
        group, jobs = self._unknown, self._jobs
        if group is None:
            return []
        try:
            tagged = await jobs.slurm.tagged_worker_jobs()
        except SlurmRayError as exc:
            log.warning("%s: worker jobs not looked up by their tag: %s", jobs.cluster_id, exc)
            return None
        self._unknown = None
        found = sorted(
            (j for j, c in tagged.items() if c == jobs.cluster_id and j not in jobs.jobs), key=int
        )
        for job_id in found:
            log.warning(
                "%s: adopted worker job %s (its submission's answer was lost)",
                jobs.cluster_id,
                job_id,
            )
            jobs.add(job_id, group)
        return found

    # -- in ----------------------------------------------------------------------------------
    async def retire(
        self, chosen: list[WorkerJob], job_dir: str, drain_timeout: float, poll: Callable[[], None]
    ) -> list[str]:
        """These worker jobs leave: pending ones are cancelled at once; running ones drained
        (the drain file read by their bootstrap), then seen out after this change until they
        ended, and cancelled if still there after ``drain_timeout`` + the grace."""
        for job in chosen:
            job.leaving = True
        await self.cancel(job for job in chosen if job.pending)
        running = [job for job in chosen if not job.ended and not job.pending]
        directory = JobDir(self._jobs.transport, job_dir)
        for job in running:
            await directory.request_drain(job.job_id, drain_timeout)
        if running:
            deadline = time.monotonic() + drain_timeout + DRAIN_GRACE
            drain = asyncio.ensure_future(self._see_out(running, deadline, poll))
            self._drains.update(dict.fromkeys((job.job_id for job in running), drain))
            drain.add_done_callback(lambda _: self._forget(drain))
        self._jobs.changed()
        return [job.job_id for job in chosen]

    async def scale_to(
        self,
        workers: int,
        job_dir: str,
        drain_timeout: float,
        poll: Callable[[], None],
        minutes: int | None = None,
        group: str = DEFAULT_GROUP,
    ) -> tuple[list[str], list[str]]:
        """As many active worker jobs of ``group`` as ``workers``: (submitted, retired ids)."""
        change = workers - len(self._jobs.active(group))
        if change > 0:
            return await self.submit(change, job_dir, minutes, group), []
        if change < 0:
            chosen = self._jobs.to_retire(-change, group)
            return [], await self.retire(chosen, job_dir, drain_timeout, poll)
        return [], []

    async def cancel(self, jobs: Iterable[WorkerJob]) -> None:
        """These worker jobs cancelled (those Slurm may still run)."""
        for job in list(jobs):
            if job.ended:
                continue
            job.leaving = True
            try:
                await self._jobs.slurm.cancel(job.job_id)
            except SlurmRayError as exc:
                log.warning("could not cancel worker job %s: %s", job.job_id, exc)
                continue
            if job.pending:  # it never ran: Slurm's CANCELLED is all that can follow
                job.state, job.reason = "CANCELLED", "cancelled while pending"

    # -- drains, seen out --------------------------------------------------------------------
    async def _see_out(
        self, running: list[WorkerJob], deadline: float, poll: Callable[[], None]
    ) -> None:
        jobs = self._jobs
        while any(not job.ended for job in running) and time.monotonic() < deadline:
            if jobs.stopped:
                return  # cancel_all cancels them
            poll()
            await asyncio.sleep(0.5)
        late = [job for job in running if not job.ended]
        if late and not jobs.stopped:
            with contextlib.suppress(SlurmRayError):
                await jobs.exclusively(lambda moves: moves.cancel(late))

    def _forget(self, drain: asyncio.Future[None]) -> None:
        for job_id in [j for j, d in self._drains.items() if d is drain]:
            del self._drains[job_id]

    def draining(self) -> list[str]:
        return [job_id for job_id in self._drains if not self._jobs.jobs[job_id].ended]

    async def until_ended(self, ids: Iterable[str]) -> None:
        """Wait until the drains of these jobs are over (each ended, or was cancelled after
        its drain timeout); a caller cancelled meanwhile leaves them going on."""
        drains = {self._drains[job_id] for job_id in ids if job_id in self._drains}
        if drains:
            await asyncio.wait(drains)

    def stop_seeing_out(self) -> None:
        """This process no longer follows the drains (its bootstrap ends each at its
        timeout)."""
        for drain in set(self._drains.values()):
            drain.cancel()


async def _to_the_end(step: Awaitable[T]) -> T:
    """``step`` run to its end even when the caller is cancelled meanwhile: the cancellation
    reaches the caller once the step ended, so what the step did is known (and recorded)."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            await asyncio.wait([task])  # cancelled again (the loop closing): it stays unknown
        if not task.cancelled():
            task.exception()  # the caller hears of its cancellation, not of the step's failure
        raise
