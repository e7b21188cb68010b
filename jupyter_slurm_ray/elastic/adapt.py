"""Adaptive scaling (issue 9, item 4): ``cluster.adapt(minimum=…, maximum=…)`` runs a loop in
the owner's process that reads Ray's unmet demand and idle nodes from Ray's own autoscaler
state (the dashboard's ``api/cluster_status``, through the cluster's dashboard forward, with
the token) and submits or retires one-node worker jobs (``WorkerJobs``) as the pure policy
(``adaptpolicy.decide``) says.

The loop asks Slurm nothing itself: the worker jobs' states come from the cluster's watcher
(the one squeue per poll). Every decision is an event in the cluster's ``events.jsonl``
(``scaled`` with its ``cause`` when jobs are submitted or retired, ``adapt`` for reports) and
one of the last lines of ``status.scaling``. A failing step is logged, shown, and the loop goes
on; it stops with ``adapt(False)``, ``stop_adapting()`` or ``down()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..aio import blocking
from ..bootstrap import dashhttp
from ..clientevents import ADAPT_REQUEST, append_event, recorded_adapting, request_cause
from ..errors import Conflict, SlurmRayError
from ..slurm.watch import watcher_for
from .groups import DEFAULT_GROUP
from .moves import Moves
from .policy import AdaptSettings, Decision, JobView, Memory, checked_settings, decide
from .raydemand import RayView, Shape, parse_cluster_status
from .scaling import ClusterScaling
from .workerjobs import worker_minutes

if TYPE_CHECKING:
    from ..client.side import ClientSide
    from ..registry import ClusterRecord
    from ..states import State, Status

log = logging.getLogger(__name__)

ADAPT_EVENT = "adapt"
INTERVAL = 2.0  # seconds between two looks at Ray's state (its monitor writes every ~5 s)
SETTLE = 12.0  # a node that joined this recently may not show in Ray's demand yet
DRAIN_TIMEOUT = 30.0
KEPT = 5  # decisions shown in the status


class Adapter:
    """The loop of one cluster's adaptive scaling."""

    def __init__(
        self, cluster: ClusterAdapting, settings: AdaptSettings, interval: float = INTERVAL
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.interval = interval
        self.memory = Memory()
        self.decisions: deque[str] = deque(maxlen=KEPT)
        self.error: str | None = None
        self.submitted: list[str] = []
        self.retired: list[str] = []
        self._idle_since: dict[str, float] = {}  # node IP -> since when it ran nothing
        self._url: str | None = None
        self._token: str | None = None
        self._task: asyncio.Task[None] | None = None

    # -- running --------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def lines(self) -> tuple[str, ...]:
        """What the status shows: the settings, a failure, the last decisions."""
        head = [self.settings.describe()]
        if self.error:
            head.append(f"adapt failed (goes on): {self.error}")
        return (*head, *self.decisions)

    async def _run(self) -> None:
        while True:
            state = self.cluster.state
            if state.is_final or self.cluster._stopping:
                return
            try:
                await self.step()
                if self.error is not None:
                    self.error = None
                    self._changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # log, show, continue
                log.warning("%s: adaptive scaling step failed: %s", self.cluster.spec.name, exc)
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if message != self.error:
                    self.error = message
                    self._changed()
            await asyncio.sleep(self.interval)

    # -- one step -------------------------------------------------------------------------
    async def step(self) -> Decision:
        """Read Ray's state, then decide, act and tell as one change of worker jobs (after
        any other under way: a scale, a rotation, a drain's end)."""
        view = await self.read_ray()
        return await self.cluster.workers.exclusively(
            lambda moves: self.decide_and_act(view, moves)
        )

    async def decide_and_act(self, view: RayView, moves: Moves) -> Decision:
        """Decide on Ray's ``view`` and the worker jobs as they are now, and act."""
        now = time.time()
        self._note_idle(view, now)
        if view.waiting or any(view.busy.values()):  # quiet: nothing waits, nothing runs
            self.memory.quiet_since = None
        elif self.memory.quiet_since is None:
            self.memory.quiet_since = now
        quiet_for = now - self.memory.quiet_since if self.memory.quiet_since else 0.0
        jobs = self.job_views(now)
        decision = decide(
            self.settings,
            self.cluster.spec.nodes,
            self.shape(view),
            view.demand,
            jobs,
            quiet_for=quiet_for,
            groups=view.groups,
            room=view.room,
        )
        await self.apply(decision, moves)
        return decision

    def shape(self, view: RayView) -> Shape:
        """A worker job's node: the head's (same spec), from Ray; else from the spec."""
        if view.head_shape is not None:
            return view.head_shape
        spec = self.cluster.spec
        memory = spec.mem_per_node * 1024 * 1024 if spec.mem_per_node else None
        return Shape(float(spec.cpus_per_node or 1), float(spec.gpus_per_node), memory)

    def job_views(self, now: float) -> list[JobView]:
        """The default group's active worker jobs as the policy sees them; a job whose
        rotation replacement is on its way is rotation's (its replacement stands for it)."""
        joined_at, ips = self._joins()
        active = self.cluster.workers.active(DEFAULT_GROUP)
        active_ids = {job.job_id for job in active}
        views = []
        for job in active:
            if job.replaced_by in active_ids:
                continue
            ip = ips.get(job.job_id)
            idle_since = self._idle_since.get(ip) if ip else None
            at = joined_at.get(job.job_id)
            views.append(
                JobView(
                    job.job_id,
                    job.pending,
                    job.reason,
                    job.joined,
                    ip,
                    idle_for=now - max(idle_since, at or 0.0) if idle_since and job.joined else 0.0,
                    settling=at is not None and now - at < SETTLE,
                )
            )
        return views

    def _joins(self) -> tuple[dict[str, float], dict[str, str]]:
        """When each worker job's node joined, and its IP (its ``worker_joined`` events)."""
        joined_at: dict[str, float] = {}
        ips: dict[str, str] = {}
        for event in self.cluster.events:
            job_id = event.get("worker_job")
            if event.get("event") == "worker_joined" and job_id:
                joined_at[str(job_id)] = float(event.get("t") or 0.0)
                if isinstance(event.get("ip"), str):
                    ips[str(job_id)] = event["ip"]
        return joined_at, ips

    def _note_idle(self, view: RayView, now: float) -> None:
        for ip, busy in view.busy.items():
            if busy:
                self._idle_since.pop(ip, None)
            else:
                self._idle_since.setdefault(ip, now)
        for ip in list(self._idle_since):
            if ip not in view.busy:
                del self._idle_since[ip]

    async def apply(self, decision: Decision, moves: Moves) -> None:
        for key, message in decision.reports:
            if key not in self.memory.reported:
                self.memory.reported.add(key)
                await self._tell(message, report=key.split(":", 1)[0])
        if decision.submit:
            await self._submit(decision, moves)
        elif decision.retire:
            await self._retire(decision, moves)

    async def _submit(self, decision: Decision, moves: Moves) -> None:
        cluster = self.cluster
        before = self._nodes()
        status = cluster.status
        minutes = worker_minutes(status.time_left, status.at, time.time())
        ids = await moves.submit(decision.submit, cluster._job_dir().path, minutes)
        self.submitted += ids
        await self._scaled(before, ids, [], decision.cause)

    async def _retire(self, decision: Decision, moves: Moves) -> None:
        cluster = self.cluster
        before = self._nodes()
        chosen = [job for job in cluster.workers.active() if job.job_id in decision.retire]
        ids = await moves.retire(
            chosen,
            cluster._job_dir().path,
            DRAIN_TIMEOUT,
            watcher_for(cluster.transport).poll_soon,
        )
        self.retired += ids
        await self._scaled(before, [], ids, decision.cause)

    async def _scaled(
        self, before: int, submitted: list[str], retired: list[str], cause: str
    ) -> None:
        cluster = self.cluster
        after = self._nodes()
        moved = (
            f"submitted {', '.join(submitted)}" if submitted else f"retired {', '.join(retired)}"
        )
        self._remember(f"{before} → {after} nodes ({moved}): {cause}")
        with contextlib.suppress(SlurmRayError):  # the decision stands without its record
            await append_event(
                cluster.transport, cluster._job_dir().path, "scaled", nodes_before=before,
                nodes=after, submitted=submitted, retired=retired, cause=f"adapt: {cause}",
            )  # fmt: skip

    def _nodes(self) -> int:
        """The nodes adapt counts: the head's allocation and the default group's worker jobs
        (other groups are scaled by hand: ``scale(n, group=...)``)."""
        return self.cluster.spec.nodes + len(self.cluster.workers.active(DEFAULT_GROUP))

    async def _tell(self, message: str, report: str) -> None:
        log.warning("%s: %s", self.cluster.spec.name, message)
        self._remember(message)
        with contextlib.suppress(SlurmRayError):
            await append_event(
                self.cluster.transport, self.cluster._job_dir().path, ADAPT_EVENT,
                report=report, cause=message,
            )  # fmt: skip

    def note(self, line: str) -> None:
        """A line of the status' last decisions (e.g. a scale refused while adapting)."""
        self._remember(line)

    def _remember(self, line: str) -> None:
        self.decisions.append(f"{time.strftime('%H:%M:%S')} {line}")
        self._changed()

    def _changed(self) -> None:
        self.cluster._update_state()

    # -- Ray's autoscaler state -------------------------------------------------------------
    async def read_ray(self) -> RayView:
        """``api/cluster_status`` of the head's dashboard (through its forward, with the
        cluster's token): Ray's unmet demand and each node's usage."""
        url, token = await self._dashboard()
        body = await asyncio.to_thread(dashhttp.get_json, url, token)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise SlurmRayError(f"the dashboard's cluster status was not understood: {body!r:.200}")
        return parse_cluster_status(data)

    async def _dashboard(self) -> tuple[str, str]:
        if self._url is None or self._token is None:
            client, job_dir = self.cluster._client, self.cluster._job_dir()
            info = await client.load_connection(job_dir)
            forward = await client._reach("dashboard", info.head_ip, info.dashboard_port)
            self._token = (await job_dir.read_token()).strip()
            self._url = dashhttp.dashboard_url(
                forward.local_host, forward.local_port, "api/cluster_status"
            )
        return self._url, self._token


def recent_decisions(events: list[dict[str, Any]], count: int = KEPT) -> tuple[str, ...]:
    """The last ``count`` scaling decisions of the events (oldest first), one line each."""
    lines: list[str] = []
    for event in reversed(events):
        line = _decision_line(event)
        if line is not None:
            lines.append(line)
            if len(lines) == count:
                break
    return tuple(reversed(lines))


def _decision_line(event: dict[str, Any]) -> str | None:
    kind, t = event.get("event"), event.get("t")
    when = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "?"
    if kind == "scaled":
        group = event.get("group")
        of = f" ({group})" if group and group != "default" else ""
        moved = [
            f"{verb} {', '.join(map(str, event[key]))}"
            for key, verb in (("submitted", "submitted"), ("retired", "retired"))
            if isinstance(event.get(key), list) and event[key]
        ]
        before, after = event.get("nodes_before"), event.get("nodes")
        return f"{when} {before} → {after} nodes{of} ({'; '.join(moved)}): {event.get('cause')}"
    if kind == "rotated":
        return f"{when} rotation: {event.get('step')} {event.get('old')} → {event.get('new')}"
    if kind in ("rotation_failed", "scale_refused", ADAPT_EVENT) and event.get("cause"):
        return f"{when} {event.get('cause')}"
    return None


def _checked_or_default(
    head_nodes: int,
    minimum: int | None,
    maximum: int | None,
    idle_timeout: float | None,
    max_pending: int | None,
    group: str | None,
) -> AdaptSettings:
    """``checked_settings`` with each setting left out (None) at its default: the head's
    nodes as the minimum, 60 s idle, 2 pending."""
    return checked_settings(
        head_nodes if minimum is None else minimum,
        maximum,
        60.0 if idle_timeout is None else idle_timeout,
        2 if max_pending is None else max_pending,
        group,
        head_nodes,
    )


class ClusterAdapting(ClusterScaling):
    """``adapt()`` for ``SlurmRayCluster`` (a mixin: see cluster.py)."""

    _adapter: Adapter | None = None
    _client: ClientSide

    @property
    def state(self) -> State:
        raise NotImplementedError

    @property
    def status(self) -> Status:
        raise NotImplementedError

    @property
    def owned_here(self) -> bool:
        raise NotImplementedError

    @property
    def events(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def adapt_async(
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
        cluster = self
        if minimum is False:
            await self.stop_adapting_async()
            return None
        settings = _checked_or_default(
            cluster.spec.nodes, minimum, maximum, idle_timeout, max_pending, group
        )
        cluster._checked_scale(settings.maximum)  # it is up, owned here, not local
        if not cluster.owned_here:
            raise SlurmRayError(
                f"cluster {cluster.spec.name} is owned by another process: attach it to adapt it"
            )
        await self.stop_adapting_async()
        self._adapter = Adapter(cluster, settings, interval)
        self._adapter.start()
        cluster._update_state()
        with contextlib.suppress(SlurmRayError):
            await append_event(
                cluster.transport, cluster._job_dir().path, ADAPT_EVENT, report="started",
                cause=settings.describe(),
            )  # fmt: skip
        return settings

    adapt = blocking(adapt_async)

    async def request_adapt_async(
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
        cluster = self
        record = cluster.registry.load(cluster.id)
        if record is not None and record.owner_gone:
            raise SlurmRayError(
                f"the owner of {cluster.spec.name} (pid {record.owner_pid} on "
                f"{record.owner_host}) is gone: attach the cluster, then adapt it"
            )
        if off:
            await append_event(cluster.transport, cluster._job_dir().path, ADAPT_REQUEST, off=True)
            return None
        settings = _checked_or_default(
            cluster.spec.nodes, minimum, maximum, idle_timeout, max_pending, None
        )
        await append_event(
            cluster.transport, cluster._job_dir().path, ADAPT_REQUEST, minimum=settings.minimum,
            maximum=settings.maximum, idle_timeout=settings.idle_timeout,
            max_pending=settings.max_pending,
        )  # fmt: skip
        return settings

    request_adapt = blocking(request_adapt_async)

    async def _apply_adapt_request(self, event: dict[str, Any]) -> None:
        asked = request_cause(event)
        try:
            if event.get("off") is True:
                await self.stop_adapting_async()
                return
            await self.adapt_async(
                event.get("minimum"),
                event.get("maximum"),
                idle_timeout=event.get("idle_timeout"),
                max_pending=event.get("max_pending"),
            )
        except SlurmRayError as exc:
            log.warning("%s: an adapt request (%s) failed: %s", self, asked, exc)

    async def stop_adapting_async(self) -> None:
        """Stop the adaptive loop (the worker jobs stay as they are)."""
        adapter, self._adapter = self._adapter, None
        if adapter is not None:
            await adapter.stop()
            self._update_state()

    stop_adapting = blocking(stop_adapting_async)

    def _refuse_while_adapting(self, group: str) -> None:
        """Conflict when a manual scale of ``group`` would fight the adapt loop: adapt alone
        sizes the default worker jobs while it runs (other groups are scaled by hand)."""
        cluster = self
        adapter = self.adapting
        if adapter is not None and group == adapter.settings.group:
            raise Conflict(adapter.settings.refuses_scale(cluster.spec.name))

    async def _refuse_if_recorded_adapting(self, record: ClusterRecord) -> None:
        """The same rule for another process: Conflict when the owner adapts, as its record
        and the adapt requests made since it was written tell."""
        cluster = self
        settings = await recorded_adapting(record, cluster._job_dir())
        if settings is not None:
            raise Conflict(settings.refuses_scale(cluster.spec.name))

    def _note_refusal(self, line: str) -> None:
        """A scale request refused while adapting, shown with adapt's decisions."""
        if self._adapter is not None:
            self._adapter.note(line)

    @property
    def adapting(self) -> Adapter | None:
        """The running adaptive loop, if any (its settings, decisions, last error)."""
        adapter = self._adapter
        return adapter if adapter is not None and adapter.running else None

    def _scaling_lines(self) -> tuple[str, ...]:
        """What the status shows of scaling: adapt's lines while it runs, else the last
        scaling decisions (scale, rotation) told in the events, with their cause; then the
        worker jobs being drained."""
        cluster = self
        adapter = self._adapter
        events = cluster._follower.events.events
        lines = adapter.lines() if adapter is not None else recent_decisions(events)
        draining = cluster.workers.draining()
        if draining:
            jobs = ", ".join(draining)
            return (*lines, f"draining worker job {jobs}: it ends once its tasks are done")
        return lines
