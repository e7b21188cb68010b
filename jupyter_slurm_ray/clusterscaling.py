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
from typing import Any

from .aio import blocking
from .errors import SlurmRayError, SpecError
from .follow import JobFollower
from .jobdir import JobDir
from .registry import Registry
from .rotation import due_for_rotation, replaced_and_joined, rotation_cause
from .scaling import (
    WorkerJob,
    WorkerJobs,
    append_event,
    checked_node_count,
    request_cause,
    request_scale,
    requested_nodes,
    worker_minutes,
)
from .spec import ClusterSpec
from .states import Status
from .transport import Transport
from .watch import watcher_for
from .workergroups import DEFAULT_GROUP, group_names

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
    _rotations: set[asyncio.Future[None]]  # a rotation move under way (rotation.py)
    _stopping: bool

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
    ) -> Status:
        """Scale to ``nodes`` Ray nodes in all: the head's allocation (``spec.nodes``) plus
        one-node worker jobs; with a worker ``group`` (see workergroups.py), to ``nodes``
        worker jobs of that group. Out: worker jobs are submitted (returns at once; they join
        as Slurm starts them). In: pending worker jobs are cancelled first, then running ones
        are drained through Ray (up to ``drain_timeout`` s) and cancelled; returns once they
        ended. SpecError (field ``nodes``) for anything but a whole number ≥ ``spec.nodes``
        (≥ 0 in a group), (field ``group``) for a group the cluster does not have. Each change
        is told as a ``scaled`` event (from, to, the jobs, ``cause``) in events.jsonl."""
        group, workers = self._checked_scale(nodes, group)
        wanted = workers if group != DEFAULT_GROUP else self.spec.nodes + workers
        watcher = watcher_for(self.transport)
        before = self.spec.nodes + self.workers.wanted
        submitted, retired = await self.workers.scale_to(
            workers,
            self._job_dir().path,
            drain_timeout=drain_timeout,
            poll=watcher.poll_soon,
            minutes=worker_minutes(self._status.time_left, self._status.at, time.time()),
            group=group,
        )
        self.workers.follow(watcher, self._update_state, self.poll_interval)
        self._update_state()
        if submitted or retired:
            with contextlib.suppress(SlurmRayError):  # the decision stands without its record
                await append_event(
                    self.transport, self._job_dir().path, "scaled", nodes_before=before,
                    nodes=wanted, group=group, submitted=submitted, retired=retired,
                    cause=cause,
                )  # fmt: skip
        return self._status

    scale = blocking(scale_async)

    async def request_scale_async(self, nodes: int, group: str | None = None) -> None:
        """From a process that does not own the cluster (the CLI, another kernel, the server):
        ask its owner to scale to ``nodes`` (of ``group``; see ``scaling.request_scale``);
        checked first."""
        self._checked_scale(nodes, group)
        record = self.registry.load(self.id)
        if record is not None and record.owner_gone:
            raise SlurmRayError(
                f"the owner of {self.spec.name} (pid {record.owner_pid} on {record.owner_host}) "
                "is gone: attach the cluster, then scale it"
            )
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
        state = self._status.state
        if state.is_final or not (state.is_up or self._follower.events.head_ready):
            raise SlurmRayError(
                f"cluster {self.spec.name} is {self._status.describe()}: scale it once it is up"
            )
        return group, count - least

    def _note_new_events(self) -> None:
        """The worker jobs' events, and scale requests from other processes (applied)."""
        events = self._follower.events.events[self._events_seen :]
        self._events_seen += len(events)
        self.workers.note_events(e for e in events if e.get("worker_job"))
        for event in events:
            request = requested_nodes(event, self._owning_since)
            if request is not None:
                task = asyncio.ensure_future(self._apply_scale_request(*request, event))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
        self._note_adapt_requests(events, self._owning_since)
        self._maybe_rotate()

    def _note_adapt_requests(self, events: list[dict[str, Any]], since: float) -> None:
        raise NotImplementedError  # ClusterAdapting's (adapt.py)

    # -- walltime rotation (rotation.py) ------------------------------------------------------
    def _maybe_rotate(self) -> None:
        """Replace worker jobs near their walltime, drain those replaced (one move at a time)."""
        if not self.spec.worker_rotation or not self._status.state.is_up or self._stopping:
            return
        if any(not task.done() for task in self._rotations):
            return
        due = due_for_rotation(
            self.workers.active(), time.time(), self.spec.worker_rotation, self._head_ends_at()
        )
        if due or replaced_and_joined(self.workers.jobs):
            task = asyncio.ensure_future(self._rotate(due))
            self._rotations.add(task)
            task.add_done_callback(self._rotations.discard)

    def _stop_rotating(self) -> None:
        for task in self._rotations:
            task.cancel()

    def _head_ends_at(self) -> float | None:
        left = self._status.time_left
        return None if left is None else self._status.at + left

    async def _rotate(self, due: list[WorkerJob]) -> None:
        job_dir, watcher = self._job_dir().path, watcher_for(self.transport)
        minutes = worker_minutes(self._status.time_left, self._status.at, time.time())
        for job in due:
            cause = rotation_cause(job, time.time())
            try:
                (new,) = await self.workers.submit(1, job_dir, minutes, job.group)
            except SlurmRayError as exc:
                job.replaced_by = "-"  # reported once, not tried again
                log.warning("%s: no replacement for worker job %s: %s", self.id, job.job_id, exc)
                await self._tell("rotation_failed", old=job.job_id, reason=str(exc), cause=cause)
                continue
            job.replaced_by = new
            await self._tell("rotated", step="submitted", old=job.job_id, new=new, cause=cause)
        for job in replaced_and_joined(self.workers.jobs):
            await self._tell("rotated", step="draining", old=job.job_id, new=job.replaced_by)
            await self.workers.retire_ids(
                [job.job_id], job_dir, drain_timeout=60.0, poll=watcher.poll_soon
            )
        self.workers.follow(watcher, self._update_state, self.poll_interval)
        self._update_state()

    async def _tell(self, event: str, **fields: Any) -> None:
        with contextlib.suppress(SlurmRayError):  # the move stands without its event
            await append_event(self.transport, self._job_dir().path, event, **fields)

    async def _apply_scale_request(
        self, nodes: int, group: str | None, event: dict[str, Any]
    ) -> None:
        try:
            await self.scale_async(nodes, group=group, cause=request_cause(event))
        except SlurmRayError as exc:
            log.warning("%s: a scale request to %s nodes failed: %s", self.spec.name, nodes, exc)
