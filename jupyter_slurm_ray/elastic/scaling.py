"""The scaling side of ``SlurmRayCluster``: scale to n nodes (its owner), ask the owner to
(anyone else), and the owner's reading of the events that concern its worker jobs.

A mixin of ``SlurmRayCluster`` (cluster.py), which provides the attributes declared here; the
worker jobs themselves, and the moves on them, are ``scaling.WorkerJobs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..aio import blocking
from ..clientevents import (
    ADAPT_REQUEST,
    append_event,
    made_after,
    request_cause,
    request_scale,
    requested_nodes,
)
from ..display import status_text
from ..errors import Conflict, SlurmRayError, SpecError
from ..follow import JobFollower
from ..job.directory import JobDir
from ..registry import Registry
from ..slurm.watch import watcher_for
from ..spec import ClusterSpec
from ..states import Status
from ..transport import Transport
from .groups import DEFAULT_GROUP, group_names
from .moves import Moves
from .rotation import due_for_rotation, replaced_and_joined, rotation_cause
from .workerjob import WorkerJob
from .workerjobs import WorkerJobs, checked_node_count, worker_minutes

log = logging.getLogger(__name__)


class ClusterScaling:
    """Scaling with worker jobs, for ``SlurmRayCluster``."""

    id: str
    spec: ClusterSpec
    transport: Transport
    registry: Registry
    poll_interval: float
    workers: WorkerJobs
    _status: Status
    _follower: JobFollower
    _events_seen: int  # events looked at for worker jobs and scale requests
    _owning_since: float  # scale requests made after this are applied
    _requests: set[asyncio.Future[None]]  # scale requests being applied
    _rotations: set[asyncio.Future[None]]  # a rotation move under way (elastic/rotation.py)
    _stopping: bool
    _last_request: asyncio.Future[None] | None = None  # requests are applied in their order

    def _job_dir(self) -> JobDir:
        raise NotImplementedError

    def _update_state(self) -> None:
        raise NotImplementedError

    async def scale_async(
        self,
        nodes: int,
        *,
        group: str | None = None,
        drain_timeout: float = 60.0,
        cause: str = "scale() by its owner",
        wait: bool = True,
    ) -> Status:
        """Scale to ``nodes`` Ray nodes in all: the head's allocation (``spec.nodes``) plus
        one-node worker jobs; with a worker ``group`` (see elastic/groups.py), to ``nodes``
        worker jobs of that group. Out: worker jobs are submitted (returns at once; they join
        as Slurm starts them). In: pending worker jobs are cancelled first, then running ones
        are drained through Ray (up to ``drain_timeout`` s) and cancelled; returns once they
        ended (``wait=False``: once the drain began, the status showing it). SpecError (field
        ``nodes``) for anything but a whole number ≥ ``spec.nodes`` (≥ 0 in a group), (field
        ``group``) for a group the cluster does not have; Conflict while adapting (the default
        group: adapt decides its size). The change waits for any other change of worker jobs
        under way, and is told as a ``scaled`` event (from, to, the jobs, ``cause``)."""
        group, workers = self._checked_scale(nodes, group)
        self._refuse_while_adapting(group)
        wanted = workers if group != DEFAULT_GROUP else self.spec.nodes + workers
        watcher, job_dir = watcher_for(self.transport), self._job_dir().path
        minutes = worker_minutes(self._status.time_left, self._status.at, time.time())

        async def move(moves: Moves) -> tuple[list[str], list[str]]:
            self._refuse_while_adapting(group)  # adapt may have started while this waited
            before = self.spec.nodes + self.workers.wanted
            submitted, retired = await moves.scale_to(
                workers, job_dir, drain_timeout, watcher.poll_soon, minutes, group
            )
            if submitted or retired:
                await self._tell(
                    "scaled", nodes_before=before, nodes=wanted, group=group,
                    submitted=submitted, retired=retired, cause=cause,
                )  # fmt: skip
            return submitted, retired

        self.workers.follow(watcher, self._update_state, self.poll_interval)  # and new ones
        _, retired = await self.workers.exclusively(move)
        self._update_state()
        if wait:
            await self.workers.until_ended(retired)
        return self._status

    scale = blocking(scale_async)

    async def request_scale_async(self, nodes: int, group: str | None = None) -> None:
        """From a process that does not own the cluster (the CLI, another kernel, the server):
        ask its owner to scale to ``nodes`` (of ``group``; a ``scale_request`` event it
        applies); checked first, and refused (Conflict) while the owner adapts, as far as its
        record and the adapt requests made since tell."""
        self._checked_scale(nodes, group)
        record = self.registry.load(self.id)
        if record is not None and record.owner_gone:
            raise SlurmRayError(
                f"the owner of {self.spec.name} (pid {record.owner_pid} on {record.owner_host}) "
                "is gone: attach the cluster, then scale it"
            )
        if record is not None and group in (None, DEFAULT_GROUP):
            await self._refuse_if_recorded_adapting(record)
        await request_scale(self.transport, self._job_dir().path, int(nodes), group)

    request_scale = blocking(request_scale_async)

    def _checked_scale(self, nodes: object, group: str | None = None) -> tuple[str, int]:
        """(the group, its worker jobs wanted) for scaling to ``nodes``, or SpecError."""
        group = DEFAULT_GROUP if group is None else group
        if group not in group_names(self.spec):
            known = ", ".join(group_names(self.spec))
            raise SpecError("group", group, f"a worker group of this cluster: {known}")
        least = self.spec.nodes if group == DEFAULT_GROUP else 0
        count = checked_node_count(nodes, least)
        if self.spec.mode == "local" and count != least:
            raise SpecError("nodes", nodes, "1 in local mode (scaling adds Slurm worker jobs)")
        if self.spec.mode == "here" and count != least:
            allowed = f"{least}: a --here cluster has its allocation's nodes (here_nodes)"
            raise SpecError("nodes", nodes, allowed)
        state = self._status.state
        if state.is_final or not (state.is_up or self._follower.events.head_ready):
            raise SlurmRayError(
                f"cluster {self.spec.name} is {status_text(self._status)}: scale it once it is up"
            )
        return group, count - least

    def _refuse_while_adapting(self, group: str) -> None:
        raise NotImplementedError  # ClusterAdapting's (elastic/adapt.py)

    async def _refuse_if_recorded_adapting(self, record: Any) -> None:
        raise NotImplementedError  # ClusterAdapting's (elastic/adapt.py)

    async def _apply_adapt_request(self, event: dict[str, Any]) -> None:
        raise NotImplementedError  # ClusterAdapting's (elastic/adapt.py)

    def _note_new_events(self) -> None:
        """The worker jobs' events, and the requests of other processes (scale, adapt),
        applied one after another in the order they were made."""
        events = self._follower.events.events[self._events_seen :]
        self._events_seen += len(events)
        self.workers.note_events(e for e in events if e.get("worker_job"))
        for event in events:
            request = requested_nodes(event, self._owning_since)
            if request is not None:
                self._in_order(partial(self._apply_scale_request, *request, event))
            elif made_after(event, ADAPT_REQUEST, self._owning_since):
                self._in_order(partial(self._apply_adapt_request, event))
        self._maybe_rotate()

    def _in_order(self, apply: Callable[[], Awaitable[None]]) -> None:
        """``apply`` once the request before it was applied (e.g. ``adapt --off`` then
        ``scale 3``: the scale is not refused for an adapt already asked to stop)."""
        previous = self._last_request

        async def after_previous() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            await apply()

        task = asyncio.ensure_future(after_previous())
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)
        self._last_request = task

    # -- walltime rotation (elastic/rotation.py) ---------------------------------------------
    def _maybe_rotate(self) -> None:
        """Replace worker jobs near their walltime, drain those replaced (one move at a time)."""
        if not self.spec.worker_rotation or not self._status.state.is_up or self._stopping:
            return
        if any(not task.done() for task in self._rotations):
            return
        if self._due_for_rotation() or replaced_and_joined(self.workers.jobs):
            task = asyncio.ensure_future(self._rotate())
            self._rotations.add(task)
            task.add_done_callback(self._rotations.discard)

    def _due_for_rotation(self) -> list[WorkerJob]:
        lead = self.spec.worker_rotation or 0
        return due_for_rotation(self.workers.active(), time.time(), lead, self._head_ends_at())

    def _stop_rotating(self) -> None:
        for task in self._rotations:
            task.cancel()

    def _head_ends_at(self) -> float | None:
        left = self._status.time_left
        return None if left is None else self._status.at + left

    async def _rotate(self) -> None:
        """One rotation move (decided under the lock, on the jobs as they are then)."""
        job_dir, watcher = self._job_dir().path, watcher_for(self.transport)
        minutes = worker_minutes(self._status.time_left, self._status.at, time.time())

        async def move(moves: Moves) -> None:
            for job in self._due_for_rotation():
                await self._replace(job, moves, job_dir, minutes)
            for job in replaced_and_joined(self.workers.jobs):
                await self._tell("rotated", step="draining", old=job.job_id, new=job.replaced_by)
                await moves.retire([job], job_dir, 60.0, watcher.poll_soon)

        with contextlib.suppress(SlurmRayError):  # the cluster stops
            await self.workers.exclusively(move)
        self._update_state()

    async def _replace(
        self, job: WorkerJob, moves: Moves, job_dir: str, minutes: int | None
    ) -> None:
        cause = rotation_cause(job, time.time())
        try:
            (new,) = await moves.submit(1, job_dir, minutes, job.group)
        except SlurmRayError as exc:
            job.replaced_by = "-"  # reported once, not tried again
            log.warning("%s: no replacement for worker job %s: %s", self.id, job.job_id, exc)
            await self._tell("rotation_failed", old=job.job_id, reason=str(exc), cause=cause)
            return
        job.replaced_by = new
        await self._tell("rotated", step="submitted", old=job.job_id, new=new, cause=cause)

    async def _tell(self, event: str, **fields: Any) -> None:
        with contextlib.suppress(SlurmRayError):  # the move stands without its event
            await append_event(self.transport, self._job_dir().path, event, **fields)

    async def _apply_scale_request(
        self, nodes: int, group: str | None, event: dict[str, Any]
    ) -> None:
        asked = request_cause(event)
        try:
            await self.scale_async(nodes, group=group, cause=asked, wait=False)
        except Conflict as exc:  # adapting: refused, and told where the requester looks
            line = f"scale to {nodes} nodes ({asked}) refused: {exc}"
            log.warning("%s: %s", self.spec.name, line)
            self._note_refusal(line)
            await self._tell("scale_refused", nodes=nodes, group=group, cause=line)
        except SlurmRayError as exc:
            log.warning("%s: a scale request to %s nodes failed: %s", self.spec.name, nodes, exc)

    def _note_refusal(self, line: str) -> None:
        raise NotImplementedError  # ClusterAdapting's (elastic/adapt.py)
