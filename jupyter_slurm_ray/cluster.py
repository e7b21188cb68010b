"""``SlurmRayCluster``: one Ray cluster in one Slurm allocation, from submit to nothing left.

The async core (``*_async`` methods) runs on the process's background loop; the blocking twins
(``up()``, ``down()``, …) are declared with :func:`aio.blocking` for notebooks. Every state
change reaches the observers with its timestamp and is saved in the registry.

Three independent clocks drive a cluster: the job watcher's polls (what Slurm says), the
bootstrap's events (what the job says), and the lease (that this owner lives). Missing
answers from Slurm never end a cluster: only Slurm's or the job's own positive word does.

One process owns a cluster (``ownership.py``): the one that started it, or attached it when its
owner was gone, or took it over. Other processes that attach it observe: their exit leaves it
running, and they never renew its lease, scale, adapt or rotate it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from . import display
from .aio import blocking, run_sync
from .bootstrap.jsr_wire import Event
from .client import connect as ray_client
from .client.mode import DRIVER, driver_precheck
from .client.side import ClientSide
from .clientevents import append_event
from .config import adapt_defaults as config_adapt_defaults
from .elastic.part import AdaptLoop, ElasticPart, ElasticWorkers, MakeElastic
from .elastic.policy import AdaptSettings
from .errors import (
    ClusterTimeout,
    ConnectError,
    SlurmRayError,
    SlurmUnavailable,
    SpecError,
)
from .follow import JobFollower
from .job import submission
from .job.directory import JobDir
from .lease import Lease
from .naming import local_mode_target, new_cluster_id
from .owner import ProcessIdentity
from .ownership import Ownership, Standing
from .registry import ClusterRecord, Registry
from .scheduler.interface import Scheduler
from .scheduler.kinds import kind_for_mode
from .scheduler.records import JobInfo
from .slurm.schedulers import scheduler_for_mode, watcher_for
from .slurm.usage import LIVE_SECONDS, Usage, fetch_usage
from .slurm.walltime import Extension, extend_walltime
from .slurm.watch import JobNews
from .spec import ClusterSpec
from .startup import wait_until
from .states import State, Status, record_fields, status_of_record
from .transport import LocalTransport, Transport

log = logging.getLogger(__name__)

__all__ = ["ClusterTimeout", "SlurmRayCluster"]

Observer = Callable[[Status], None]
AdaptDefaults = Callable[[], Mapping[str, float]]

_owned: weakref.WeakSet[SlurmRayCluster] = weakref.WeakSet()  # cancelled at exit
_QUEUED = (State.SUBMITTING, State.PENDING)


class SlurmRayCluster:
    """A Ray cluster inside a Slurm allocation.

    >>> cluster = SlurmRayCluster(ClusterSpec(nodes=2, time="1:00:00"))
    >>> cluster.up()            # submit, wait for all nodes, connect Ray Client
    >>> cluster.down()          # disconnect, cancel, wait until nothing is left

    Every operation is a coroutine ``name_async`` with a blocking twin ``name`` declared next
    to it. The twins: ``up``, ``wait_up``, ``wait_ready``, ``connect``, ``disconnect``,
    ``down``, ``close``, ``detach``, ``attach``, ``refresh``, ``logs``, ``script``,
    ``connection_info``, ``usage``, ``extend``; ``scale``, ``request_scale``, ``adapt``,
    ``request_adapt``, ``stop_adapting``, ``scale_or_ask``, ``adapt_or_ask`` (done by the
    cluster's elastic part, its elastic/scaling.py; the last two are every front door's: its
    owner applies, any other process asks).
    """

    def __init__(
        self,
        spec: ClusterSpec,
        transport: Transport | None = None,
        *,
        registry: Registry | None = None,
        cluster_id: str | None = None,
        poll_interval: float = 1.0,
        steady_poll_interval: float = 15.0,
        submit_timeout: float = 60.0,
        process: ProcessIdentity | None = None,
        driver_hosts: Sequence[str] | None = None,
        adapt_defaults: AdaptDefaults | None = None,
        elastic: MakeElastic | None = None,
    ) -> None:
        """``process``: whose cluster object this is (default: this process's); the fast
        tests model a second kernel with it. ``driver_hosts``: ``SlurmRay.driver_hosts``
        (None: from its environment variable). ``adapt_defaults``: adapt's settings where a
        request leaves them out, read when adapt is asked for (``config.adapt_defaults`` of
        the process's configuration; None: of the environment). ``elastic``: what makes the
        cluster's elastic part (None: the package's, ``elastic/scaling.py``'s ``Elastic``; the
        cluster knows it as ``elastic/part.py`` names it)."""
        self.spec = spec
        self.adapt_defaults: AdaptDefaults = adapt_defaults or config_adapt_defaults
        self.transport = transport or LocalTransport()
        self.target = self.transport.target  # what the record names: where it runs, and how
        kind = kind_for_mode(spec.mode)  # Slurm's sbatch, local mode's processes, --here steps
        if kind.on_this_machine:  # whatever the transport, the jobs run where this kernel does
            self.transport = self.transport.for_local_mode()
            self.target = local_mode_target(self.transport.target)
        self.slurm: Scheduler = scheduler_for_mode(spec.mode, self.transport)
        self.registry = registry or Registry()
        self.id = cluster_id or new_cluster_id(spec.name)
        self.poll_interval = poll_interval  # Slurm asked this often while a change is expected
        self.steady_poll_interval = steady_poll_interval  # ... and this often once up
        self.submit_timeout = submit_timeout
        self.job_dir: str | None = None
        self.ownership = Ownership(self.id, self.registry, spec.owner_timeout, process=process)
        self.ownership.on_displaced = self._displaced
        self.ownership.on_change = self._update_state
        self._following = False  # subscribed to the job watcher
        self._status = Status(State.SUBMITTING, nodes_wanted=spec.nodes)
        self._observers: list[Observer] = []
        self._follower = JobFollower()
        self._changed: asyncio.Event | None = None
        self._client = ClientSide(
            self.transport, self.registry, self.id, self._save_record, driver_hosts
        )
        make_elastic = elastic or _package_elastic
        self.elastic: ElasticPart = make_elastic(self, self.slurm, self._update_state)
        self._cancels: set[asyncio.Future[None]] = set()  # worker job cancels under way
        self._stopping = False
        self._detached = False
        self._recorded = False  # written once: later writes never re-create a forgotten record
        self._stop_notice: str | None = None  # why a stop may take longer
        self.history: list[Status] = []
        self.created_at = time.time()

    # -- what the user sees ---------------------------------------------------------------
    @property
    def status(self) -> Status:
        """The current status, pushed by the job watcher every poll; ``refresh()`` asks now."""
        return self._status

    @property
    def state(self) -> State:
        return self._status.state

    @property
    def lease(self) -> Lease:
        """The lease this process renews while it owns the cluster."""
        return self.ownership.lease

    @property
    def owned_here(self) -> bool:
        """This process owns the cluster (started it, attached it ownerless, or took it
        over): it keeps its lease, scales it, and cancels it at exit unless detached."""
        return self.ownership.owned

    @property
    def observing(self) -> bool:
        """This process watches the cluster that another process owns."""
        return self.ownership.role is Standing.OBSERVER

    @property
    def workers(self) -> ElasticWorkers:
        """The cluster's extra worker jobs (``elastic.workers``)."""
        return self.elastic.workers

    @property
    def stopping(self) -> bool:
        """``down`` began."""
        return self._stopping

    @property
    def head_ready(self) -> bool:
        """The head answers (its event), perhaps before Slurm's answer says RUNNING."""
        return self._follower.events.head_ready

    @property
    def job_id(self) -> str | None:
        return self._status.job_id

    @property
    def events(self) -> list[dict[str, Any]]:
        """The bootstrap's events read so far (``events.jsonl``: phases, nodes, errors…)."""
        return list(self._follower.events.events)

    def add_observer(self, observer: Observer) -> None:
        """``observer(status)`` is called on every state change (from the loop thread)."""
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        with contextlib.suppress(ValueError):
            self._observers.remove(observer)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return display.mimebundle(self, include, exclude)

    def __repr__(self) -> str:
        return (
            f"<SlurmRayCluster {self.spec.name} ({self.id}): {display.status_text(self._status)}>"
        )

    @property
    def dashboard_url(self) -> str | None:
        return self._client.dashboard_url

    @property
    def connection(self) -> ray_client.ConnectionInfo | None:
        """The head's address, ports and versions, once known (``connection.json``)."""
        return self._client.connection

    @property
    def token_path(self) -> str | None:
        """This process's copy of the cluster's Ray token (0600), once connected."""
        return self._client.token_path

    @property
    def ca_path(self) -> str | None:
        """This process's copy of the cluster's CA, once connected to a cluster with TLS: what
        ``dashboard_url`` (the head's relay, https) must be checked against."""
        return str(self._client.tls.ca) if self._client.tls is not None else None

    # -- lifecycle ------------------------------------------------------------------------
    @classmethod
    def from_record(
        cls,
        record: ClusterRecord,
        transport: Transport,
        *,
        registry: Registry | None = None,
        process: ProcessIdentity | None = None,
        driver_hosts: Sequence[str] | None = None,
        adapt_defaults: AdaptDefaults | None = None,
        elastic: MakeElastic | None = None,
    ) -> SlurmRayCluster:
        """Rebuild a cluster object from its registry record (see :meth:`attach_async`): it
        reads, and may stop the cluster, but neither owns nor observes it until attached.

        ``transport`` comes from this process's configuration (``targets.Transports``),
        never from the record.
        """
        spec = ClusterSpec.from_mapping(record.spec, stored=True) if record.spec else ClusterSpec()
        cluster = cls(
            spec,
            transport,
            registry=registry,
            cluster_id=record.id,
            process=process,
            driver_hosts=driver_hosts,
            adapt_defaults=adapt_defaults,
            elastic=elastic,
        )
        cluster.ownership.know_record(record)
        cluster.job_dir = record.job_dir or None
        cluster._detached = record.detached
        cluster.created_at = record.created_at
        cluster._status = status_of_record(record)
        cluster.workers.load_record(record.worker_jobs)
        cluster._recorded = True
        return cluster

    async def attach_async(self, *, takeover: bool = False) -> SlurmRayCluster:
        """Watch a running cluster from this process (e.g. after a kernel restart).

        When a live process owns it (its lease fresh and, on its own host, the process
        running), this one *observes* (``observing``; its status says who owns it): it can
        connect, watch, read logs and usage and stop it, but its exit leaves the cluster
        running. When its owner is gone, or with ``takeover``, this process becomes the
        owner (``owned_here``): it keeps the lease, scales it, cancels it at exit unless
        detached; a previous owner that still runs stands down at its next lease renewal.
        """
        job_id = self._status.job_id
        if job_id is None:
            raise SlurmRayError(f"cluster {self.id} has no Slurm job to attach to")
        if self._changed is None:
            self._changed = asyncio.Event()
        await self.refresh_async()
        if self._status.state.is_final or self.owned_here:
            return self
        if await self.ownership.settle(self.job_directory(), takeover=takeover) is Standing.OWNER:
            self._own(job_id)
        else:
            self._follow(job_id)
            self.ownership.watch(self.job_directory)
        self._update_state()
        return self

    attach = blocking(attach_async)

    async def script_async(self) -> str:
        """The job script that ``up()`` would submit (nothing is submitted)."""
        await self._scheduler_for_up()
        job_dir, script = await submission.prepare(self.transport, self.spec, self.id, self.job_dir)
        self.job_dir = job_dir.path
        return script

    script = blocking(script_async)

    async def up_async(
        self,
        wait: bool | str = True,
        *,
        connect: bool = True,
        queue_timeout: float | None = None,
        start_timeout: float | None = None,
    ) -> SlurmRayCluster:
        """Submit the job; with ``wait``, return once every node joined and (with ``connect``)
        this process is connected; ``wait="head"`` returns once connected to the head, the
        workers joining live. The connect starts as soon as the head answers. ``connect``
        also says whether this process will connect (``wait=False`` too): with ``connect =
        "driver"``, what makes driver mode impossible here is told before submitting."""
        if self._status.job_id is not None:
            raise SlurmRayError(f"cluster {self.id} was already started (job {self.job_id})")
        self._changed = asyncio.Event()
        scheduler = await self._scheduler_for_up()  # mode 'here': its allocation checked
        # the job dir root is checked before anything is written
        job_dir, script = await submission.prepare(self.transport, self.spec, self.id)
        if connect and self.spec.connect == DRIVER:  # who connects: the front door says
            obstacle = await driver_precheck(self.transport, job_dir.path.rsplit("/", 1)[0])
            if obstacle:
                raise ConnectError(
                    f"connect = driver is not possible here: {obstacle}; nothing was submitted "
                    "(connect = auto or client connects through Ray Client)"
                )
        self.job_dir = job_dir.path
        self.ownership.become_owner(0)
        self._save_record()
        job_id = await submission.submit(
            scheduler,
            job_dir,
            self.spec,
            self.id,
            script=script,
            lease=self.lease.text(),
            timeout=self.submit_timeout,
            forget_record=lambda: self.registry.delete(self.id),
        )
        self._own(job_id)
        self._set_status(replace(self._status, state=State.PENDING, job_id=job_id))
        if wait:
            await self.wait_up_async(
                until="head" if wait == "head" else "ready",
                connect=connect,
                queue_timeout=queue_timeout,
                start_timeout=start_timeout,
            )
        return self

    up = blocking(up_async)

    async def _scheduler_for_up(self) -> Scheduler:
        """What starts the job, once its scheduler made the spec what will run
        (``Scheduler.for_request``: mode 'here' plans it in this kernel's allocation)."""
        self.spec, scheduler = await self.slurm.for_request(self.spec)
        return scheduler

    async def wait_up_async(
        self,
        *,
        until: str = "ready",
        connect: bool = True,
        queue_timeout: float | None = None,
        start_timeout: float | None = None,
        connect_timeout: float = 30.0,
    ) -> Status:
        """Wait for the head, connect (while the workers still join), then wait for every
        node; ``until="head"`` returns once connected to the head, nodes joining live."""
        if until not in ("ready", "head"):
            raise SpecError("until", until, "'ready' (every node) or 'head'")
        limits = {"queue_timeout": queue_timeout, "start_timeout": start_timeout}
        follower = self._follower
        preparing = asyncio.ensure_future(self._prepare_connect()) if connect else None
        connecting = None
        try:
            await wait_until(self, lambda s: follower.events.head_ready or s.state.is_up, **limits)
            if connect:
                connecting = asyncio.ensure_future(self.connect_async(timeout=connect_timeout))
            if until == "ready":
                await self.wait_ready_async(**limits)
        except BaseException:
            if preparing is not None:
                preparing.cancel()
            if connecting is not None:  # the connect runs in a thread: let it end, then undo it
                with contextlib.suppress(Exception):
                    await connecting
            if connect:
                await self.disconnect_async()
            raise
        if connecting is not None:
            await connecting
        return self._status

    wait_up = blocking(wait_up_async)

    async def wait_ready_async(
        self, queue_timeout: float | None = None, start_timeout: float | None = None
    ) -> Status:
        """Wait until every node joined. Queue time and Ray start-up time have separate limits."""
        follower = self._follower
        return await wait_until(
            self,
            lambda s: s.state.is_up and follower.events.ready,
            queue_timeout=queue_timeout,
            start_timeout=start_timeout,
        )

    wait_ready = blocking(wait_ready_async)

    async def _prepare_connect(self) -> None:
        """While ``up`` waits: ``import ray`` now, and once the job runs, start choosing how
        to connect (driver mode: this host's Ray node joins as soon as the head's GCS is
        verified, before the head answers)."""
        self._client.import_ray_ahead()
        with contextlib.suppress(SlurmRayError):
            status = await wait_until(self, lambda s: s.state not in _QUEUED)
            if status.job_id is None or status.state.is_final:
                return
            self._client.prepare(self.job_directory(), self.spec, status.job_id)
            follower = self._follower
            if await self._client.head_answers(
                self.job_directory(), lambda: follower.events.head_ready
            ):
                self.poll_soon()  # its events now, not at the next tick

    async def connect_async(
        self, timeout: float = 30.0, attempts: int = 3, mode: str | None = None
    ) -> None:
        """Connect this kernel: as a Ray driver through a Ray node of this host, or with Ray
        Client (through SSH forwards when remote), as ``mode`` (else ``spec.connect``) says."""
        if not (self._status.state.is_up or self._follower.events.head_ready):
            raise ConnectError(
                f"cluster {self.spec.name} is {display.status_text(self._status)}, not READY"
            )
        if mode is not None:
            self.spec.replace(connect=mode)  # checked as the setting is
        job_id = self._status.job_id or ""
        await self._client.connect(
            self.job_directory(),
            self.spec,
            job_id,
            timeout=timeout,
            attempts=attempts,
            setting=mode,
        )
        self._update_state()

    connect = blocking(connect_async)

    async def disconnect_async(self) -> None:
        """Disconnect this kernel; in driver mode this host's Ray node stops too."""
        if self._client.active:
            await self._client.disconnect()
            self._update_state()

    disconnect = blocking(disconnect_async)

    async def down_async(self, timeout: float = 60.0) -> Status:
        """Disconnect, cancel the job, and wait until Slurm says it ended.

        The lease is released first: should Slurm not answer the cancel, the cluster still
        stops itself once its lease is stale (``owner_timeout``).
        """
        await self.elastic.stop_adapting()
        await self.disconnect_async()
        if self._status.job_id is None or self._status.state.is_final:
            self._client.close_forwards()
            return self._status
        self._stopping = True
        self.elastic.stop_rotating()
        self.lease.release()
        self._update_state()
        await self._tell_stop_requested()
        await self.workers.cancel_all()
        try:
            await self.slurm.cancel(self._status.job_id)
        except SlurmUnavailable as exc:
            self._stop_notice = (
                f"Slurm did not take the cancel ({exc}); the cluster stops by itself within "
                f"{self.spec.owner_timeout:g} s, as its lease is no longer renewed"
            )
            log.warning("%s: %s", self.spec.name, self._stop_notice)
            self._update_state()
        self.poll_soon()
        deadline = time.monotonic() + timeout
        while not self._status.state.is_final and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            if self._changed is None:  # attached without a watcher loop
                with contextlib.suppress(SlurmUnavailable):
                    await self.refresh_async()
        self._client.close_forwards()
        return self._status

    down = blocking(down_async)

    async def _tell_stop_requested(self) -> None:
        """A ``stop_requested`` event, so the owner (if another process) reports STOPPED."""
        if not self.job_dir:
            return
        try:
            await append_event(self.transport, self.job_dir, Event.STOP_REQUESTED, within=10.0)
        except SlurmRayError as exc:  # the cancel still goes ahead; the owner says CANCELLED
            log.info("%s: stop_requested not written: %s", self.spec.name, exc)

    async def close_async(self) -> None:
        """Release this object's connections (the cluster itself is left as it is)."""
        await self.disconnect_async()
        self._client.close_forwards()
        self.ownership.leave()
        self._unfollow()
        await self.transport.close()

    close = blocking(close_async)

    async def detach_async(self) -> None:
        """Keep the cluster running after this kernel exits (until its walltime)."""
        self.require_owner("detach it")
        await self.job_directory().mark_detached(f"{os.getpid()}\n")
        self._detached = True
        self._save_record()

    detach = blocking(detach_async)

    async def refresh_async(self) -> Status:
        """Ask Slurm and the job dir now (``status`` is kept current by the watcher anyway)."""
        job_id = self._status.job_id
        if job_id is not None and not self._status.state.is_final:
            try:
                infos = await self.slurm.query([job_id])
            except SlurmUnavailable as exc:
                silent = self._follower.silent_since or time.time()
                await self._on_answer(JobNews(None, False, silent, str(exc)))
            else:
                answer = JobNews(infos.get(job_id))
                watcher_for(self.transport).remember(job_id, answer)
                await self._on_answer(answer)
        return self._status

    refresh = blocking(refresh_async)

    async def logs_async(self, node: str | None = None, tail: int = 100) -> str:
        """The job's output (``node=None``) or one node's Ray log, last ``tail`` lines."""
        return await self.job_directory().logs(self._status.job_id, node, tail)

    logs = blocking(logs_async)

    def job_client(self) -> Any:
        """A Ray Jobs client (``JobSubmissionClient``) through the dashboard, with the token."""
        return self._client.job_client()

    async def connection_info_async(self) -> ray_client.ConnectionInfo:
        """The head's address, ports and versions (``connection.json``), once READY."""
        return await self._client.load_connection(self.job_directory())

    connection_info = blocking(connection_info_async)

    # -- elasticity: the cluster's elastic part does it (elastic/scaling.py) ----------------
    async def scale_async(self, nodes: int, **options: Any) -> Status:
        """``Elastic.scale``: to ``nodes`` Ray nodes, by the owner only (``request_scale``
        asks the owner)."""
        return await self.elastic.scale(nodes, **options)

    scale = blocking(scale_async)

    async def request_scale_async(self, nodes: int, group: str | None = None) -> None:
        """``Elastic.request_scale``: ask the owner to scale."""
        await self.elastic.request_scale(nodes, group)

    request_scale = blocking(request_scale_async)

    async def adapt_async(self, *args: Any, **options: Any) -> AdaptSettings | None:
        """``Elastic.adapt``: scale as Ray's demand needs, between a minimum and a maximum."""
        return await self.elastic.adapt(*args, **options)

    adapt = blocking(adapt_async)

    async def request_adapt_async(self, *args: Any, **options: Any) -> AdaptSettings | None:
        """``Elastic.request_adapt``: ask the owner to adapt (or to stop, ``off=True``)."""
        return await self.elastic.request_adapt(*args, **options)

    request_adapt = blocking(request_adapt_async)

    async def stop_adapting_async(self) -> None:
        """Stop adapting (the worker jobs stay as they are)."""
        await self.elastic.stop_adapting()

    stop_adapting = blocking(stop_adapting_async)

    async def scale_or_ask_async(
        self, nodes: int, group: str | None = None, *, wait: bool = True
    ) -> bool:
        """``Elastic.scale_or_ask``: its owner scales (True), any other process asks (False)."""
        return await self.elastic.scale_or_ask(nodes, group, wait=wait)

    scale_or_ask = blocking(scale_or_ask_async)

    async def adapt_or_ask_async(
        self, *args: Any, **options: Any
    ) -> tuple[AdaptSettings | None, bool]:
        """``Elastic.adapt_or_ask``: its owner adapts (True), any other process asks (False)."""
        return await self.elastic.adapt_or_ask(*args, **options)

    adapt_or_ask = blocking(adapt_or_ask_async)

    @property
    def adapting(self) -> AdaptLoop | None:
        """The running adaptive loop, if any (its settings, decisions, last error)."""
        return self.elastic.adapting

    async def dashboard_endpoint(self) -> tuple[str, int, str | None]:
        """Where this process reaches the head's dashboard (through its forward), and the
        cluster's CA when that is the head's relay (https), else None."""
        job_dir = self.job_directory()
        forward = await self._client.dashboard_forward(job_dir)
        tls = await self._client.local_tls(job_dir)
        return forward.local_host, forward.local_port, str(tls.ca) if tls else None

    def require_owner(self, what: str) -> None:
        if self._status.job_id is not None:
            self.ownership.require(f"{what} ({self.spec.name})", self.spec.name)

    # -- following the job, as its owner or an observer -----------------------------------
    def _own(self, job_id: str) -> None:
        """Watch the job and keep its lease from now on (until it ends)."""
        _owned.add(self)
        self.elastic.own()
        self._follow(job_id)
        if not self._stopping:
            job_dir = self.job_directory()
            self.lease.keep(job_dir.write_lease, lambda: self.ownership.still_owner(job_dir))

    def _follow(self, job_id: str) -> None:
        """Subscribe to the job watcher: Slurm's answers and the job's events (once)."""
        watcher = watcher_for(self.transport, self.poll_interval, self.registry.path)
        if not self._following:
            self._following = True
            watcher.watch(job_id, self._on_answer, pace=self._pace(), tick=self.poll_interval)
        self.workers.follow(watcher, self._update_state, self.poll_interval)

    def _unfollow(self) -> None:
        watcher = watcher_for(self.transport)
        if self._status.job_id:
            watcher.unwatch(self._status.job_id, self._on_answer)
        self._following = False
        self.workers.unfollow(watcher)

    def _displaced(self, owner: ProcessIdentity) -> None:
        """Another process took the cluster over: stop acting as its owner (no lease, no
        scaling, adapting or rotation, no cancel at exit); keep watching it as an observer."""
        _owned.discard(self)
        self.elastic.displaced()
        if self.job_dir:
            self.ownership.watch(self.job_directory)
        self._update_state()

    def _pace(self) -> float:
        """Seconds between Slurm's answers this cluster needs now: often while it changes,
        seldom once up (its own events, read every tick, tell of changes meanwhile)."""
        state = self._status.state
        if state.is_up and self._follower.events.ready and not self._stopping:
            return self.steady_poll_interval
        if state is State.PENDING:  # its first event (read every tick) tells when it starts
            return max(self.poll_interval, min(5.0, self.steady_poll_interval))
        return self.poll_interval

    def _tick(self) -> float:
        """Seconds between reads of the job's events (the worker jobs' too): often until it
        is up, and while a worker job joins or leaves."""
        if (
            self._status.state.is_up
            and self._follower.events.ready
            and not self._stopping
            and not self.workers.in_transition()
        ):
            return self.steady_poll_interval
        return self.poll_interval

    def poll_soon(self) -> None:
        """Ask Slurm about the cluster's jobs at once (its transport's watcher's next query)."""
        watcher_for(self.transport).poll_soon()

    def job_directory(self) -> JobDir:
        if self.job_dir is None:
            raise SlurmRayError(f"cluster {self.id} has no job dir yet")
        return JobDir(self.transport, self.job_dir)

    async def _on_answer(self, answer: JobNews) -> None:
        """One poll's news: Slurm's answer (or silence) plus the job's new events."""
        log_tail = await self._follower.observe(answer, self.job_directory(), self.slurm)
        self.elastic.note_new_events()
        if self._follower.news_for_slurm and not answer.fresh:  # the job's events say so
            self.poll_soon()
        if self._follower.events.ready and self.connection is None:
            with contextlib.suppress(SlurmRayError):  # the record then has the head's address
                await self._client.load_connection(self.job_directory())
        self._update_state(answer.job, log_tail)
        if self._changed is not None:  # `up` waits on the events too (head_ready, ready)
            self._changed.set()
        if self._status.state.is_final:
            self.lease.release()
            if self.owned_here:  # the head ended: its worker jobs end too
                # scheduled, not awaited: it waits for an sbatch in flight (up to a minute),
                # and the watcher tells every cluster of this process its news in turn
                task = asyncio.ensure_future(self.workers.cancel_all())
                self._cancels.add(task)
                task.add_done_callback(self._cancelled_worker_jobs)
            if self._status.job_id:
                watcher_for(self.transport).unwatch(self._status.job_id, self._on_answer)
                self._following = False

    def _cancelled_worker_jobs(self, task: asyncio.Future[None]) -> None:
        self._cancels.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("cancelling the worker jobs of %s failed: %s", self.id, task.exception())

    def _update_state(self, job: JobInfo | None = None, log_tail: str = "") -> None:
        status = self._follower.status(
            self._status,
            job,
            connected=self._client.connected,
            stopping=self._stopping,
            log_tail=log_tail,
            stop_notice=self._stop_notice,
        )
        status = replace(
            status,
            nodes_wanted=self.spec.nodes + self.workers.wanted,
            worker_jobs=self.workers.views(),
            scaling=self.elastic.scaling_lines(),
            ownership=self.ownership.note(),
            connect_mode=self._client.mode.mode if self._client.mode else None,
            connect_reason=self._client.mode.reason if self._client.mode else None,
        )
        if status.state.is_final and self._client.connected:
            self._client.lost()
            log.warning(
                "cluster %s ended while connected (%s); Ray calls will fail until you connect "
                "to a running cluster",
                self.spec.name,
                display.status_text(status),
            )
        self._set_status(status)

    def _set_status(self, status: Status) -> None:
        changed = not status.same_as(self._status)
        if not changed and self.history:
            self._status = status
            return
        self._status = status = replace(status, at=time.time())
        self.history.append(status)
        if status.job_id:
            watcher = watcher_for(self.transport)
            watcher.set_pace(status.job_id, self._pace(), self._tick())
            self.workers.set_paces(watcher, self.poll_interval, self.steady_poll_interval)
        self._save_record()
        if self._changed is not None:
            self._changed.set()
        for observer in list(self._observers):
            try:
                observer(status)
            except Exception:
                log.exception("cluster observer failed")

    def _save_record(self) -> None:
        s, status, info = self.spec, self._status, self.connection
        record = ClusterRecord(
            id=self.id,
            name=s.name,
            target=self.target,
            job_dir=self.job_dir or "",
            **record_fields(status),
            nodes_wanted=s.nodes + self.workers.wanted,
            gpus_per_node=s.gpus_per_node,
            head_ip=info.head_ip if info else None,
            client_port=info.client_port if info else None,
            dashboard_port=info.dashboard_port if info else None,
            forwards=self._client.open_forwards(),
            detached=self._detached,
            worker_jobs=self.workers.to_record(),
            adapting=self.elastic.adapting_settings(),
            spec=s.to_dict(),
            created_at=self.created_at,
        )
        try:
            written = self.ownership.save(record, create=not self._recorded)
            if not written and self.owned_here:
                log.info("the record of %s was forgotten; not writing it again", self.id)
            self._recorded = True
        except (OSError, SlurmRayError) as exc:
            log.warning("could not save the record of %s: %s", self.id, exc)

    # -- what Slurm's accounting says: usage, and the walltime --------------------------------
    # (issue 11) Read-only towards the registry: a process that does not own the cluster (the
    # CLI, another kernel) never rewrites its record from here.
    def slurm_job_ids(self) -> list[str]:
        """The Slurm jobs of this cluster: the head's, then its worker jobs'."""
        head = [self._status.job_id] if self._status.job_id else []
        return head + list(self.workers.jobs)

    async def usage_async(self) -> Usage:
        """What the cluster's jobs used (sacct: CPU- and GPU-hours, CPU efficiency, max RSS
        per node); final once they ended. One sacct, unless this process knows it already."""
        ended = self._status.state.is_final  # then only a final answer is kept
        max_age = 0 if ended else LIVE_SECONDS
        return await fetch_usage(self.transport, self.slurm_job_ids(), max_age=max_age)

    usage = blocking(usage_async)

    async def extend_async(self, amount: str | int) -> Extension:
        """Add walltime (``"+30"`` minutes, ``"+1:00:00"``) with ``scontrol update``;
        ExtendRefused with Slurm's words and what to do when the site does not allow it."""
        extension = await extend_walltime(self.slurm, self._status.job_id, amount)
        if self.owned_here and not self._status.state.is_final:
            await self.refresh_async()  # the owner keeps its status (and record) current
        return extension

    extend = blocking(extend_async)


@atexit.register
def _cancel_owned_clusters() -> None:
    """On interpreter exit, cancel the clusters this process owns, unless detached (those it
    only observes are left running: see ``ownership.py``)."""
    for cluster in list(_owned):
        if cluster._detached or cluster.state.is_final or cluster.job_id is None:
            continue
        if not cluster.owned_here:  # taken over by another process meanwhile
            continue
        with contextlib.suppress(Exception):
            run_sync(cluster.workers.cancel_all(), timeout=15)
        with contextlib.suppress(Exception):
            run_sync(cluster.slurm.cancel(cluster.job_id), timeout=15)
            log.info("cancelled job %s of cluster %s at exit", cluster.job_id, cluster.id)


def _package_elastic(
    host: SlurmRayCluster, slurm: Scheduler, on_change: Callable[[], None]
) -> ElasticPart:
    """The package's elastic part (worker jobs, scaling, adapt, rotation), imported when the
    first cluster is made: importing the package stays cheap."""
    from .elastic.scaling import Elastic

    return Elastic(host, slurm, on_change)
