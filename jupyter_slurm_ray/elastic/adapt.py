"""Adaptive scaling (issue 9, item 4): ``cluster.adapt(minimum=…, maximum=…)`` runs a loop in
the owner's process that reads Ray's unmet demand and idle nodes from Ray's own autoscaler
state (the dashboard's ``api/cluster_status``, through the cluster's dashboard forward, with
the token) and submits or retires one-node worker jobs (``WorkerJobs``) as the pure policy
(``policy.decide``) says.

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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..bootstrap import dashhttp
from ..bootstrap.jsr_wire import WORKER_JOB_FIELD, Event
from ..clientevents import append_event
from ..errors import SlurmRayError
from ..spec.groups import DEFAULT_GROUP
from .adaptoptions import ADAPT_DEFAULTS
from .moves import Moves, WorkerBook
from .policy import (
    AdaptSettings,
    Decision,
    JobView,
    Memory,
    checked_settings,
    decide,
)
from .raydemand import RayView, Shape, parse_cluster_status
from .workerjob import worker_minutes

if TYPE_CHECKING:
    from .host import ClusterHost

log = logging.getLogger(__name__)

INTERVAL = 2.0  # seconds between two looks at Ray's state (its monitor writes every ~5 s)
SETTLE = 12.0  # a node that joined this recently may not show in Ray's demand yet
DRAIN_TIMEOUT = 30.0
KEPT = 5  # decisions shown in the status


class Adapter:
    """The loop of one cluster's adaptive scaling."""

    def __init__(
        self,
        host: ClusterHost,
        workers: WorkerBook,
        settings: AdaptSettings,
        interval: float = INTERVAL,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.host = host
        self.workers = workers
        self._on_change = on_change
        self.settings = settings
        self.interval = interval
        self.memory = Memory()
        self.decisions: deque[str] = deque(maxlen=KEPT)
        self.error: str | None = None
        self.submitted: list[str] = []
        self.retired: list[str] = []
        self._idle_since: dict[str, float] = {}  # node IP -> since when it ran nothing
        self._url: str | None = None
        self._ca: str | None = None  # the cluster's CA when the dashboard is the head's relay
        self._token: str | None = None
        self._task: asyncio.Task[None] | None = None

    # -- running --------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Cancel the loop and wait until it ended (a step under way may be submitting or
        cancelling a worker job). The loop's own end is not raised; a cancellation of the
        caller while it waits is."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                log.warning("%s: adaptive scaling ended: %s", self.host.spec.name, failure)

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
            if self.host.status.state.is_final or self.host.stopping:
                return
            try:
                await self.step()
                if self.error is not None:
                    self.error = None
                    self._changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # log, show, continue
                log.warning("%s: adaptive scaling step failed: %s", self.host.spec.name, exc)
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
        return await self.workers.exclusively(lambda moves: self.decide_and_act(view, moves))

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
            self.host.spec.nodes,
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
        spec = self.host.spec
        memory = spec.mem_per_node * 1024 * 1024 if spec.mem_per_node else None
        return Shape(float(spec.cpus_per_node or 1), float(spec.gpus_per_node), memory)

    def job_views(self, now: float) -> list[JobView]:
        """The default group's active worker jobs as the policy sees them; a job whose
        rotation replacement is on its way is rotation's (its replacement stands for it)."""
        joined_at, ips = self._joins()
        active = self.workers.active(DEFAULT_GROUP)
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
        for event in self.host.events:
            job_id = event.get(WORKER_JOB_FIELD)
            if event.get("event") == Event.WORKER_JOINED and job_id:
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
        before = self._nodes()
        status = self.host.status
        minutes = worker_minutes(status.time_left, status.at, time.time())
        ids = await moves.submit(decision.submit, self.host.job_directory().path, minutes)
        self.submitted += ids
        await self._scaled(before, ids, [], decision.cause)

    async def _retire(self, decision: Decision, moves: Moves) -> None:
        before = self._nodes()
        chosen = [job for job in self.workers.active() if job.job_id in decision.retire]
        ids = await moves.retire(
            chosen,
            self.host.job_directory().path,
            DRAIN_TIMEOUT,
            self.host.poll_soon,
        )
        self.retired += ids
        await self._scaled(before, [], ids, decision.cause)

    async def _scaled(
        self, before: int, submitted: list[str], retired: list[str], cause: str
    ) -> None:
        after = self._nodes()
        moved = (
            f"submitted {', '.join(submitted)}" if submitted else f"retired {', '.join(retired)}"
        )
        self._remember(f"{before} → {after} nodes ({moved}): {cause}")
        with contextlib.suppress(SlurmRayError):  # the decision stands without its record
            await append_event(
                self.host.transport, self.host.job_directory().path, Event.SCALED,
                nodes_before=before, nodes=after, submitted=submitted, retired=retired,
                cause=f"adapt: {cause}",
            )  # fmt: skip

    def _nodes(self) -> int:
        """The nodes adapt counts: the head's allocation and the default group's worker jobs
        (other groups are scaled by hand: ``scale(n, group=...)``)."""
        return self.host.spec.nodes + len(self.workers.active(DEFAULT_GROUP))

    async def _tell(self, message: str, report: str) -> None:
        log.warning("%s: %s", self.host.spec.name, message)
        self._remember(message)
        with contextlib.suppress(SlurmRayError):
            await append_event(
                self.host.transport, self.host.job_directory().path, Event.ADAPT,
                report=report, cause=message,
            )  # fmt: skip

    def note(self, line: str) -> None:
        """A line of the status' last decisions (e.g. a scale refused while adapting)."""
        self._remember(line)

    def _remember(self, line: str) -> None:
        self.decisions.append(f"{time.strftime('%H:%M:%S')} {line}")
        self._changed()

    def _changed(self) -> None:
        self._on_change()

    # -- Ray's autoscaler state -------------------------------------------------------------
    async def read_ray(self) -> RayView:
        """``api/cluster_status`` of the head's dashboard (through its forward, with the
        cluster's token): Ray's unmet demand and each node's usage."""
        url, token = await self._dashboard()
        body = await asyncio.to_thread(dashhttp.get_json, url, token, ca_file=self._ca)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise SlurmRayError(f"the dashboard's cluster status was not understood: {body!r:.200}")
        return parse_cluster_status(data)

    async def _dashboard(self) -> tuple[str, str]:
        if self._url is None or self._token is None:
            host, port, self._ca = await self.host.dashboard_endpoint()
            self._token = (await self.host.job_directory().read_token()).strip()
            tls = self._ca is not None
            self._url = dashhttp.dashboard_url(host, port, "api/cluster_status", tls=tls)
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
    if kind == Event.SCALED:
        group = event.get("group")
        of = f" ({group})" if group and group != "default" else ""
        moved = [
            f"{verb} {', '.join(map(str, event[key]))}"
            for key, verb in (("submitted", "submitted"), ("retired", "retired"))
            if isinstance(event.get(key), list) and event[key]
        ]
        before, after = event.get("nodes_before"), event.get("nodes")
        return f"{when} {before} → {after} nodes{of} ({'; '.join(moved)}): {event.get('cause')}"
    if kind == Event.ROTATED:
        return f"{when} rotation: {event.get('step')} {event.get('old')} → {event.get('new')}"
    if kind in (Event.ROTATION_FAILED, Event.SCALE_REFUSED, Event.ADAPT) and event.get("cause"):
        return f"{when} {event.get('cause')}"
    return None


def checked_or_default(
    head_nodes: int,
    minimum: int | None,
    maximum: int | None,
    idle_timeout: float | None,
    max_pending: int | None,
    group: str | None,
    defaults: Mapping[str, float] = ADAPT_DEFAULTS,
) -> AdaptSettings:
    """``checked_settings`` with each setting left out (None) at its default: the head's
    nodes as the minimum, the others from ``defaults`` (``config.adapt_defaults``: the
    ``SlurmRay.adapt_*`` settings, else ``adaptoptions.ADAPT_OPTIONS``' own)."""
    return checked_settings(
        head_nodes if minimum is None else minimum,
        maximum,
        defaults["idle_timeout"] if idle_timeout is None else idle_timeout,
        int(defaults["max_pending"]) if max_pending is None else max_pending,
        group,
        head_nodes,
    )
