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
from .scaling import (
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

    def _job_dir(self) -> JobDir:
        raise NotImplementedError

    def _update_state(self) -> None:
        raise NotImplementedError

    async def scale_async(
        self, nodes: int, *, drain_timeout: float = 60.0, cause: str = "scale() by its owner"
    ) -> Status:
        """Scale to ``nodes`` Ray nodes in all: the head's allocation (``spec.nodes``) plus
        one-node worker jobs. Out: worker jobs are submitted (returns at once; they join as
        Slurm starts them). In: pending worker jobs are cancelled first, then running ones are
        drained through Ray (up to ``drain_timeout`` s) and cancelled; returns once they ended.
        SpecError (field ``nodes``) for anything but a whole number ≥ ``spec.nodes``. Each
        change is told as a ``scaled`` event (from, to, the jobs, ``cause``) in events.jsonl."""
        wanted = self._checked_scale(nodes)
        watcher = watcher_for(self.transport)
        before = self.spec.nodes + self.workers.wanted
        submitted, retired = await self.workers.scale_to(
            wanted - self.spec.nodes,
            self._job_dir().path,
            drain_timeout=drain_timeout,
            poll=watcher.poll_soon,
            minutes=worker_minutes(self._status.time_left, self._status.at, time.time()),
        )
        self.workers.follow(watcher, self._update_state, self.poll_interval)
        self._update_state()
        if submitted or retired:
            with contextlib.suppress(SlurmRayError):  # the decision stands without its record
                await append_event(
                    self.transport, self._job_dir().path, "scaled", nodes_before=before,
                    nodes=wanted, submitted=submitted, retired=retired, cause=cause,
                )  # fmt: skip
        return self._status

    scale = blocking(scale_async)

    async def request_scale_async(self, nodes: int) -> None:
        """From a process that does not own the cluster (the CLI, another kernel, the server):
        ask its owner to scale to ``nodes`` (see ``scaling.request_scale``); checked first."""
        wanted = self._checked_scale(nodes)
        record = self.registry.load(self.id)
        if record is not None and record.owner_gone:
            raise SlurmRayError(
                f"the owner of {self.spec.name} (pid {record.owner_pid} on {record.owner_host}) "
                "is gone: attach the cluster, then scale it"
            )
        await request_scale(self.transport, self._job_dir().path, wanted)

    request_scale = blocking(request_scale_async)

    def _checked_scale(self, nodes: object) -> int:
        wanted = checked_node_count(nodes, self.spec.nodes)
        if self.spec.mode == "local" and wanted != self.spec.nodes:
            raise SpecError("nodes", nodes, "1 in local mode (scaling adds Slurm worker jobs)")
        state = self._status.state
        if state.is_final or not (state.is_up or self._follower.events.head_ready):
            raise SlurmRayError(
                f"cluster {self.spec.name} is {self._status.describe()}: scale it once it is up"
            )
        return wanted

    def _note_new_events(self) -> None:
        """The worker jobs' events, and scale requests from other processes (applied)."""
        events = self._follower.events.events[self._events_seen :]
        self._events_seen += len(events)
        self.workers.note_events(e for e in events if e.get("worker_job"))
        for event in events:
            nodes = requested_nodes(event, self._owning_since)
            if nodes is not None:
                task = asyncio.ensure_future(self._apply_scale_request(nodes, event))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)

    async def _apply_scale_request(self, nodes: int, event: dict[str, Any]) -> None:
        try:
            await self.scale_async(nodes, cause=request_cause(event))
        except SlurmRayError as exc:
            log.warning("%s: a scale request to %s nodes failed: %s", self.spec.name, nodes, exc)
