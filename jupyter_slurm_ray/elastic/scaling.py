"""The elastic part of a cluster (``cluster.elastic``): its worker jobs, scaling to n nodes (by
its owner) or asking the owner to (anyone else), adapting to Ray's demand (the loop itself:
``adapt.py``), walltime rotation (``rotation.py``), and the owner's reading of the events that
concern them (other processes' requests).

The cluster holds one ``Elastic``, made for it by the package's maker (``part.py``: the cluster
never imports this module), and gives it what it reads of the cluster (``host.py``); the worker
jobs themselves, and the moves on them, are ``workerjobs.WorkerJobs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..bootstrap.jsr_wire import WORKER_JOB_FIELD, Event
from ..clientevents import (
    append_event,
    made_after,
    request_cause,
    request_scale,
    requested_nodes,
)
from ..display import status_text
from ..errors import Conflict, SlurmRayError, SpecError
from ..job.directory import JobDir
from ..registry import ClusterRecord
from ..scheduler.interface import Scheduler
from ..scheduler.kinds import kind_for_mode
from ..slurm.schedulers import watcher_for
from ..spec.groups import DEFAULT_GROUP, group_names
from ..states import Status
from .adapt import INTERVAL, Adapter, checked_or_default, recent_decisions
from .host import ClusterHost
from .moves import Moves
from .policy import AdaptSettings
from .rotation import due_for_rotation, replaced_and_joined, rotation_cause
from .workerjob import WorkerJob, worker_minutes
from .workerjobs import WorkerJobs, checked_node_count

log = logging.getLogger(__name__)


class Elastic:
    """The worker jobs of one cluster and everything that changes them."""

    def __init__(self, host: ClusterHost, slurm: Scheduler, on_change: Callable[[], None]) -> None:
        self.host = host
        self.workers = WorkerJobs(host.transport, slurm, host.id, host.spec)
        self._on_change = on_change
        self._adapter: Adapter | None = None
        self._events_seen = 0  # events looked at for worker jobs and scale requests
        self._owning_since = float("inf")  # scale requests made after this are applied
        self._requests: set[asyncio.Future[None]] = set()  # requests being applied
        self._rotations: set[asyncio.Future[None]] = set()  # a rotation move under way
        self._last_request: asyncio.Future[None] | None = None  # applied in their order

    # -- owning ---------------------------------------------------------------------------
    def own(self) -> None:
        """This process owns the cluster from now: requests made from now on are applied."""
        self._owning_since = min(self._owning_since, time.time())

    def displaced(self) -> None:
        """Another process took the cluster over: no requests applied, no rotation, no adapt."""
        self._owning_since = float("inf")
        self.stop_rotating()
        if self._adapter is not None:
            task = asyncio.ensure_future(self.stop_adapting())
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    # -- scaling --------------------------------------------------------------------------
    async def scale(
        self,
        nodes: int,
        *,
        group: str | None = None,
        drain_timeout: float = 60.0,
        cause: str = "scale() by its owner",
        wait: bool = True,
    ) -> Status:
        """Scale to ``nodes`` Ray nodes in all: the head's allocation (``spec.nodes``) plus
        one-node worker jobs; with a worker ``group`` (see spec/groups.py), to ``nodes``
        worker jobs of that group. Out: worker jobs are submitted (returns at once; they join
        as Slurm starts them). In: pending worker jobs are cancelled first, then running ones
        are drained through Ray (up to ``drain_timeout`` s) and cancelled; returns once they
        ended (``wait=False``: once the drain began, the status showing it). SpecError (field
        ``nodes``) for anything but a whole number ≥ ``spec.nodes`` (≥ 0 in a group), (field
        ``group``) for a group the cluster does not have; Conflict while adapting (the default
        group: adapt decides its size). The change waits for any other change of worker jobs
        under way, and is told as a ``scaled`` event (from, to, the jobs, ``cause``)."""
        self.host.require_owner("scale it (request_scale asks its owner)")
        group, workers = self.checked_scale(nodes, group)
        self._refuse_while_adapting(group)
        spec, status = self.host.spec, self.host.status
        wanted = workers if group != DEFAULT_GROUP else spec.nodes + workers
        watcher, job_dir = watcher_for(self.host.transport), self.host.job_directory().path
        minutes = worker_minutes(status.time_left, status.at, time.time())

        async def move(moves: Moves) -> tuple[list[str], list[str]]:
            self._refuse_while_adapting(group)  # adapt may have started while this waited
            before = spec.nodes + self.workers.wanted
            submitted, retired = await moves.scale_to(
                workers, job_dir, drain_timeout, watcher.poll_soon, minutes, group
            )
            if submitted or retired:
                await self._tell(
                    Event.SCALED, nodes_before=before, nodes=wanted, group=group,
                    submitted=submitted, retired=retired, cause=cause,
                )  # fmt: skip
            return submitted, retired

        self.workers.follow(watcher, self._on_change, self.host.poll_interval)  # and new ones
        _, retired = await self.workers.exclusively(move)
        self._on_change()
        if wait:
            await self.workers.until_ended(retired)
        return self.host.status

    async def request_scale(self, nodes: int, group: str | None = None) -> None:
        """From a process that does not own the cluster (the CLI, another kernel, the server):
        ask its owner to scale to ``nodes`` (of ``group``; a ``scale_request`` event it
        applies); checked first, and refused (Conflict) while the owner adapts, as far as its
        record and the adapt requests made since tell."""
        self.checked_scale(nodes, group)
        record = self.host.registry.load(self.host.id)
        if record is not None and record.owner_gone:
            raise SlurmRayError(
                f"the owner of {self.host.spec.name} (pid {record.owner_pid} on "
                f"{record.owner_host}) is gone: attach the cluster, then scale it"
            )
        if record is not None and group in (None, DEFAULT_GROUP):
            await self._refuse_if_recorded_adapting(record)
        await request_scale(self.host.transport, self.host.job_directory().path, int(nodes), group)

    def checked_scale(self, nodes: object, group: str | None = None) -> tuple[str, int]:
        """(the group, its worker jobs wanted) for scaling to ``nodes``, or SpecError."""
        group = DEFAULT_GROUP if group is None else group
        spec, status = self.host.spec, self.host.status
        if group not in group_names(spec):
            known = ", ".join(group_names(spec))
            raise SpecError("group", group, f"a worker group of this cluster: {known}")
        least = spec.nodes if group == DEFAULT_GROUP else 0
        count = checked_node_count(nodes, least)
        fixed = kind_for_mode(spec.mode).fixed_size(least)
        if fixed is not None and count != least:
            raise SpecError("nodes", nodes, fixed)
        if status.state.is_final or not (status.state.is_up or self.host.head_ready):
            raise SlurmRayError(
                f"cluster {spec.name} is {status_text(status)}: scale it once it is up"
            )
        return group, count - least

    def note_new_events(self) -> None:
        """The worker jobs' events, and the requests of other processes (scale, adapt),
        applied one after another in the order they were made."""
        events = self.host.events[self._events_seen :]
        self._events_seen += len(events)
        self.workers.note_events(e for e in events if e.get(WORKER_JOB_FIELD))
        for event in events:
            request = requested_nodes(event, self._owning_since)
            if request is not None:
                self._in_order(partial(self._apply_scale_request, *request, event))
            elif made_after(event, Event.ADAPT_REQUEST, self._owning_since):
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
        host = self.host
        if not host.owned_here or host.stopping or not host.status.state.is_up:
            return
        if not host.spec.worker_rotation:
            return
        if any(not task.done() for task in self._rotations):
            return
        if self._due_for_rotation() or replaced_and_joined(self.workers.jobs):
            task = asyncio.ensure_future(self._rotate())
            self._rotations.add(task)
            task.add_done_callback(self._rotations.discard)

    def _due_for_rotation(self) -> list[WorkerJob]:
        lead = self.host.spec.worker_rotation or 0
        return due_for_rotation(self.workers.active(), time.time(), lead, self._head_ends_at())

    def stop_rotating(self) -> None:
        for task in self._rotations:
            task.cancel()

    def _head_ends_at(self) -> float | None:
        status = self.host.status
        return None if status.time_left is None else status.at + status.time_left

    async def _rotate(self) -> None:
        """One rotation move (decided under the lock, on the jobs as they are then)."""
        job_dir, watcher = self.host.job_directory().path, watcher_for(self.host.transport)
        status = self.host.status
        minutes = worker_minutes(status.time_left, status.at, time.time())

        async def move(moves: Moves) -> None:
            for job in self._due_for_rotation():
                await self._replace(job, moves, job_dir, minutes)
            for job in replaced_and_joined(self.workers.jobs):
                await self._tell(
                    Event.ROTATED, step="draining", old=job.job_id, new=job.replaced_by
                )
                await moves.retire([job], job_dir, 60.0, watcher.poll_soon)

        with contextlib.suppress(SlurmRayError):  # the cluster stops
            await self.workers.exclusively(move)
        self._on_change()

    async def _replace(
        self, job: WorkerJob, moves: Moves, job_dir: str, minutes: int | None
    ) -> None:
        cause = rotation_cause(job, time.time())
        try:
            (new,) = await moves.submit(1, job_dir, minutes, job.group)
        except SlurmRayError as exc:
            job.replaced_by = "-"  # reported once, not tried again
            log.warning("%s: no replacement for worker job %s: %s", self.host.id, job.job_id, exc)
            await self._tell(Event.ROTATION_FAILED, old=job.job_id, reason=str(exc), cause=cause)
            return
        job.replaced_by = new
        await self._tell(Event.ROTATED, step="submitted", old=job.job_id, new=new, cause=cause)

    async def _tell(self, event: str, **fields: Any) -> None:
        with contextlib.suppress(SlurmRayError):  # the move stands without its event
            await append_event(self.host.transport, self.host.job_directory().path, event, **fields)

    async def _apply_scale_request(
        self, nodes: int, group: str | None, event: dict[str, Any]
    ) -> None:
        asked = request_cause(event)
        try:
            await self.scale(nodes, group=group, cause=asked, wait=False)
        except Conflict as exc:  # adapting: refused, and told where the requester looks
            line = f"scale to {nodes} nodes ({asked}) refused: {exc}"
            log.warning("%s: %s", self.host.spec.name, line)
            self._note_refusal(line)
            await self._tell(Event.SCALE_REFUSED, nodes=nodes, group=group, cause=line)
        except SlurmRayError as exc:
            log.warning(
                "%s: a scale request to %s nodes failed: %s", self.host.spec.name, nodes, exc
            )

    # -- the owner applies, anyone else asks: the one place of that rule -----------------------
    async def scale_or_ask(
        self, nodes: int, group: str | None = None, *, wait: bool = True
    ) -> bool:
        """Scale (its owner, True) or ask its owner to (any other process: a ``scale_request``
        event it applies; False). Every front door scales through this."""
        if self.host.owned_here:
            await self.scale(nodes, group=group, wait=wait)
            return True
        await self.request_scale(nodes, group)
        return False

    async def adapt_or_ask(
        self,
        minimum: int | None = None,
        maximum: int | None = None,
        *,
        off: bool = False,
        idle_timeout: float | None = None,
        max_pending: int | None = None,
        group: str | None = None,
    ) -> tuple[AdaptSettings | None, bool]:
        """Adapt, or stop adapting (``off``): its owner (True), or any other process by asking
        the owner (an ``adapt_request`` event; False). The settings in force or asked for
        (None: off). Every front door adapts through this."""
        if not self.host.owned_here:
            if group not in (None, DEFAULT_GROUP):
                raise SpecError("group", group, "'default' when asking the owner (scale others)")
            asked = await self.request_adapt(
                minimum, maximum, off=off, idle_timeout=idle_timeout, max_pending=max_pending
            )
            return asked, False
        if off:
            await self.stop_adapting()
            return None, True
        settings = await self.adapt(
            minimum, maximum, idle_timeout=idle_timeout, max_pending=max_pending, group=group
        )
        return settings, True

    # -- adapting (the loop: adapt.py) ------------------------------------------------------
    async def adapt(
        self,
        minimum: int | bool | None = None,
        maximum: int | None = None,
        *,
        idle_timeout: float | None = None,
        max_pending: int | None = None,
        group: str | None = None,
        interval: float = INTERVAL,
    ) -> AdaptSettings | None:
        """Scale between ``minimum`` and ``maximum`` Ray nodes in all (the head's allocation
        plus one-node worker jobs) as Ray's demand needs: worker jobs are submitted for pending
        tasks, actors and placement groups (at most ``max_pending`` waiting in Slurm's queue
        at once), and idle ones (nothing run for ``idle_timeout`` s) drained and cancelled.
        ``adapt(False)`` stops (as ``stop_adapting()``). Defaults: ``SlurmRay.adapt_*``
        settings. SpecError (one line, naming the field) for bad input; nothing changes then.
        Returns the settings in force (None when stopped)."""
        host = self.host
        if minimum is False:
            await self.stop_adapting()
            return None
        asked = (minimum, maximum, idle_timeout, max_pending, group)
        settings = checked_or_default(host.spec.nodes, *asked, host.adapt_defaults())
        self.checked_scale(settings.maximum)  # it is up, owned here, not local
        if not host.owned_here:
            raise SlurmRayError(
                f"cluster {host.spec.name} is owned by another process: attach it to adapt it"
            )
        await self.stop_adapting()
        self._adapter = Adapter(host, self.workers, settings, interval, self._on_change)
        self._adapter.start()
        self._on_change()
        await self._tell(Event.ADAPT, report="started", cause=settings.describe())
        return settings

    async def request_adapt(
        self,
        minimum: int | None = None,
        maximum: int | None = None,
        *,
        off: bool = False,
        idle_timeout: float | None = None,
        max_pending: int | None = None,
    ) -> AdaptSettings | None:
        """From a process that does not own the cluster (the CLI, another kernel, the server):
        ask its owner to adapt with these settings (checked here first, one line), or to stop;
        an ``adapt_request`` event the owner reads anyway and applies."""
        host = self.host
        record = host.registry.load(host.id)
        if record is not None and record.owner_gone:
            raise SlurmRayError(
                f"the owner of {host.spec.name} (pid {record.owner_pid} on "
                f"{record.owner_host}) is gone: attach the cluster, then adapt it"
            )
        job_dir = host.job_directory().path
        if off:
            await append_event(host.transport, job_dir, Event.ADAPT_REQUEST, off=True)
            return None
        settings = checked_or_default(
            host.spec.nodes,
            minimum,
            maximum,
            idle_timeout,
            max_pending,
            None,
            host.adapt_defaults(),
        )
        await append_event(
            host.transport, job_dir, Event.ADAPT_REQUEST, minimum=settings.minimum,
            maximum=settings.maximum, idle_timeout=settings.idle_timeout,
            max_pending=settings.max_pending,
        )  # fmt: skip
        return settings

    async def _apply_adapt_request(self, event: dict[str, Any]) -> None:
        asked = request_cause(event)
        try:
            if event.get("off") is True:
                await self.stop_adapting()
                return
            await self.adapt(
                event.get("minimum"),
                event.get("maximum"),
                idle_timeout=event.get("idle_timeout"),
                max_pending=event.get("max_pending"),
            )
        except SlurmRayError as exc:
            log.warning("%s: an adapt request (%s) failed: %s", self.host.id, asked, exc)

    async def stop_adapting(self) -> None:
        """Stop the adaptive loop (the worker jobs stay as they are)."""
        adapter, self._adapter = self._adapter, None
        if adapter is not None:
            await adapter.stop()
            self._on_change()

    def _refuse_while_adapting(self, group: str) -> None:
        """Conflict when a manual scale of ``group`` would fight the adapt loop: adapt alone
        sizes the default worker jobs while it runs (other groups are scaled by hand)."""
        adapter = self.adapting
        if adapter is not None and group == adapter.settings.group:
            raise Conflict(adapter.settings.refuses_scale(self.host.spec.name))

    async def _refuse_if_recorded_adapting(self, record: ClusterRecord) -> None:
        """The same rule for another process: Conflict when the owner adapts, as its record
        and the adapt requests made since it was written tell."""
        settings = await recorded_adapting(record, self.host.job_directory())
        if settings is not None:
            raise Conflict(settings.refuses_scale(self.host.spec.name))

    def _note_refusal(self, line: str) -> None:
        """A scale request refused while adapting, shown with adapt's decisions."""
        if self._adapter is not None:
            self._adapter.note(line)

    @property
    def adapting(self) -> Adapter | None:
        """The running adaptive loop, if any (its settings, decisions, last error)."""
        adapter = self._adapter
        return adapter if adapter is not None and adapter.running else None

    def adapting_settings(self) -> dict[str, Any] | None:
        """What the record keeps of adapt while it runs (``AdaptSettings.to_dict``)."""
        adapter = self.adapting
        return adapter.settings.to_dict() if adapter is not None else None

    def scaling_lines(self) -> tuple[str, ...]:
        """What the status shows of scaling: adapt's lines while it runs, else the last
        scaling decisions (scale, rotation) told in the events, with their cause; then the
        worker jobs being drained."""
        adapter = self._adapter
        lines = adapter.lines() if adapter is not None else recent_decisions(self.host.events)
        draining = self.workers.draining()
        if draining:
            jobs = ", ".join(draining)
            return (*lines, f"draining worker job {jobs}: it ends once its tasks are done")
        return lines


async def recorded_adapting(record: ClusterRecord, job_dir: JobDir) -> AdaptSettings | None:
    """Whether a cluster's owner adapts, as another process can tell: the settings its record
    keeps (``adapting``), changed by the adapt requests made after the record was written (its
    owner applies them in order, before a request made now)."""
    settings = AdaptSettings.from_dict(record.adapting)
    try:
        events = await job_dir.recent_events(200)
    except SlurmRayError:
        return settings
    for event in events:
        if not made_after(event, Event.ADAPT_REQUEST, record.updated_at):
            continue
        off = event.get("off") is True
        settings = None if off else AdaptSettings.from_dict(event) or settings
    return settings
