"""``SlurmRayCluster``: one Ray cluster in one Slurm allocation, from submit to nothing left.

The async core (``*_async`` methods) runs on the process's background loop; the blocking twins
(``up()``, ``down()``, …) are declared with :func:`aio.blocking` for notebooks. Every state
change reaches the observers with its timestamp and is saved in the registry.

Three independent clocks drive a cluster: the job watcher's polls (what Slurm says), the
bootstrap's events (what the job says), and the lease (that this owner lives). Missing
answers from Slurm never end a cluster: only Slurm's or the job's own positive word does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import connect as ray_client
from .aio import blocking, run_sync
from .errors import (
    ClusterTimeout,
    ConnectError,
    RayStartError,
    SlurmError,
    SlurmRayError,
    SlurmUnavailable,
)
from .follow import JobFollower
from .jobdir import SCRIPT, JobDir, Site, probe_site
from .jobscript import render_job_script
from .lease import Lease
from .naming import new_cluster_id
from .registry import ClusterRecord, Registry
from .slurm import JobInfo, SlurmClient
from .spec import ClusterSpec
from .states import State, Status, record_fields, status_of_record
from .submission import submit_or_adopt
from .transport import Forward, LocalTransport, Transport
from .watch import Answer, watcher_for

log = logging.getLogger(__name__)

__all__ = ["ClusterTimeout", "SlurmRayCluster"]

Observer = Callable[[Status], None]

_owned: weakref.WeakSet[SlurmRayCluster] = weakref.WeakSet()


class SlurmRayCluster:
    """A Ray cluster inside a Slurm allocation.

    >>> cluster = SlurmRayCluster(ClusterSpec(nodes=2, time="1:00:00"))
    >>> cluster.up()            # submit, wait for all nodes, connect Ray Client
    >>> cluster.down()          # disconnect, cancel, wait until nothing is left

    Every operation is a coroutine ``name_async`` with a blocking twin ``name`` declared next
    to it: ``up``, ``wait_ready``, ``connect``, ``disconnect``, ``down``, ``close``,
    ``detach``, ``attach``, ``refresh``, ``logs``, ``script``, ``connection_info``.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        transport: Transport | None = None,
        *,
        registry: Registry | None = None,
        cluster_id: str | None = None,
        poll_interval: float = 1.0,
        submit_timeout: float = 60.0,
    ) -> None:
        self.spec = spec
        self.transport = transport or LocalTransport()
        self.slurm = SlurmClient(self.transport)
        self.registry = registry or Registry()
        self.id = cluster_id or new_cluster_id(spec.name)
        self.poll_interval = poll_interval
        self.submit_timeout = submit_timeout
        self.connection: ray_client.ConnectionInfo | None = None
        self.job_dir: str | None = None
        self.lease = Lease(spec.idle_timeout)
        self._status = Status(State.SUBMITTING, nodes_wanted=spec.nodes)
        self._observers: list[Observer] = []
        self._follower = JobFollower()
        self._changed: asyncio.Event | None = None
        self._forwards: dict[str, Forward] = {}
        self._connected = False
        self._stopping = False
        self._detached = False
        self._stop_notice: str | None = None  # why a stop may take longer
        self._token_path: str | None = None
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
    def job_id(self) -> str | None:
        return self._status.job_id

    def add_observer(self, observer: Observer) -> None:
        """``observer(status)`` is called on every state change (from the loop thread)."""
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        with contextlib.suppress(ValueError):
            self._observers.remove(observer)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from .reprs import cluster_mimebundle

        return cluster_mimebundle(self, include, exclude)

    def __repr__(self) -> str:
        return f"<SlurmRayCluster {self.spec.name} ({self.id}): {self._status.describe()}>"

    @property
    def dashboard_url(self) -> str | None:
        fwd = self._forwards.get("dashboard")
        if fwd is not None:
            return f"http://{fwd.local_host}:{fwd.local_port}/"
        if self.connection is not None:
            return f"http://{self.connection.head_ip}:{self.connection.dashboard_port}/"
        return None

    # -- lifecycle ------------------------------------------------------------------------
    @classmethod
    def from_record(
        cls, record: ClusterRecord, transport: Transport, *, registry: Registry | None = None
    ) -> SlurmRayCluster:
        """Rebuild a cluster object from its registry record (see :meth:`attach_async`).

        ``transport`` comes from this process's configuration (``targets.Transports``),
        never from the record.
        """
        spec = ClusterSpec.from_mapping(record.spec) if record.spec else ClusterSpec()
        cluster = cls(spec, transport, registry=registry, cluster_id=record.id)
        cluster.job_dir = record.job_dir or None
        cluster._detached = record.detached
        cluster.created_at = record.created_at
        cluster._status = status_of_record(record)
        return cluster

    async def attach_async(self) -> SlurmRayCluster:
        """Adopt a running cluster (e.g. after a kernel restart): watch it and own its lease."""
        if self._status.job_id is None:
            raise SlurmRayError(f"cluster {self.id} has no Slurm job to attach to")
        self._changed = asyncio.Event()
        await self.refresh_async()
        if not self._status.state.is_final:
            self._own(self._status.job_id)
        return self

    attach = blocking(attach_async)

    async def script_async(self) -> str:
        """The job script that ``up()`` would submit (nothing is submitted)."""
        return self._render(await self._site())

    script = blocking(script_async)

    async def up_async(
        self,
        wait: bool = True,
        *,
        connect: bool = True,
        queue_timeout: float | None = None,
        start_timeout: float | None = None,
    ) -> SlurmRayCluster:
        """Submit the job; with ``wait``, return once every node joined (and connected)."""
        if self._status.job_id is not None:
            raise SlurmRayError(f"cluster {self.id} was already started (job {self.job_id})")
        self._changed = asyncio.Event()
        site = await self._site()  # checks the job dir root before anything is written
        script = self._render(site)
        job_dir = self._job_dir()
        self._save_record()
        try:
            await job_dir.create(self.spec, self.id, script=script, lease=self.lease.text())
        except SlurmRayError:
            self.registry.delete(self.id)  # nothing was written: leave nothing behind
            raise
        job_id = await self._submit(job_dir)
        self._own(job_id)
        self._set_status(replace(self._status, state=State.PENDING, job_id=job_id))
        if wait:
            await self.wait_ready_async(queue_timeout=queue_timeout, start_timeout=start_timeout)
            if connect:
                await self.connect_async()
        return self

    up = blocking(up_async)

    async def wait_ready_async(
        self, queue_timeout: float | None = None, start_timeout: float | None = None
    ) -> Status:
        """Wait for READY. Queue time and Ray start-up time have separate limits."""
        start_limit = start_timeout if start_timeout is not None else self.spec.start_timeout + 30
        assert self._changed is not None, "call up() first"
        queued_since = started_since = None
        while True:
            status = self._status
            if status.state.is_up:
                return status
            if status.state.is_final:
                raise RayStartError(
                    f"cluster {self.spec.name} is {status.state}: {status.reason}",
                    status.log_tail,
                )
            now = time.monotonic()
            if status.state in (State.SUBMITTING, State.PENDING):
                queued_since = queued_since or now
                if queue_timeout is not None and now - queued_since > queue_timeout:
                    await self.down_async()
                    raise ClusterTimeout(
                        f"job {status.job_id} waited {queue_timeout:g} s in the queue "
                        f"({status.reason or 'no reason given'}); it was cancelled"
                    )
            elif status.slurm_unreachable_since is None:  # Slurm's silence is not Ray's fault
                started_since = started_since or now
                if now - started_since > start_limit:
                    tail = await self.logs_async(tail=30)
                    await self.down_async()
                    raise ClusterTimeout(
                        f"Ray did not come up within {start_limit:g} s of the job starting "
                        f"(phase: {status.phase}, {status.nodes_joined}/{status.nodes_wanted} "
                        f"nodes); the job was cancelled.\n{tail}"
                    )
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)

    wait_ready = blocking(wait_ready_async)

    async def connect_async(self, timeout: float = 30.0, attempts: int = 3) -> None:
        """Connect this kernel with Ray Client (through SSH forwards when remote)."""
        if not self._status.state.is_up:
            raise ConnectError(f"cluster {self.spec.name} is {self._status.describe()}, not READY")
        info = await self._load_connection()
        ray_client.preflight(info)
        token_path = await self._local_token()
        client = await self._reach("client", info.head_ip, info.client_port)
        await self._reach("dashboard", info.head_ip, info.dashboard_port)
        address = f"ray://{client.local_host}:{client.local_port}"
        await asyncio.to_thread(
            ray_client.connect_ray_client, address, token_path, timeout=timeout, attempts=attempts
        )
        self._connected = True
        self._update_state()

    connect = blocking(connect_async)

    async def disconnect_async(self) -> None:
        if self._connected:
            await asyncio.to_thread(ray_client.disconnect_ray_client)
            self._connected = False
            self._update_state()

    disconnect = blocking(disconnect_async)

    async def down_async(self, timeout: float = 60.0) -> Status:
        """Disconnect, cancel the job, and wait until Slurm says it ended.

        The lease is released first: should Slurm not answer the cancel, the cluster still
        stops itself once its lease is stale (``idle_timeout``).
        """
        await self.disconnect_async()
        if self._status.job_id is None or self._status.state.is_final:
            self._close_forwards()
            return self._status
        self._stopping = True
        self.lease.release()
        self._update_state()
        try:
            await self.slurm.cancel(self._status.job_id)
        except SlurmUnavailable as exc:
            self._stop_notice = (
                f"Slurm did not take the cancel ({exc}); the cluster stops by itself within "
                f"{self.spec.idle_timeout:g} s, as its lease is no longer renewed"
            )
            log.warning("%s: %s", self.spec.name, self._stop_notice)
            self._update_state()
        watcher_for(self.transport).poll_soon()
        deadline = time.monotonic() + timeout
        while not self._status.state.is_final and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            if self._changed is None:  # attached without a watcher loop
                with contextlib.suppress(SlurmUnavailable):
                    await self.refresh_async()
        self._close_forwards()
        return self._status

    down = blocking(down_async)

    async def close_async(self) -> None:
        """Release this object's connections (the cluster itself is left as it is)."""
        await self.disconnect_async()
        self._close_forwards()
        self.lease.release()
        if self._status.job_id:
            watcher_for(self.transport).unwatch(self._status.job_id, self._on_answer)
        await self.transport.close()

    close = blocking(close_async)

    async def detach_async(self) -> None:
        """Keep the cluster running after this kernel exits (until its walltime)."""
        await self._job_dir().mark_detached(f"{os.getpid()}\n")
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
                await self._on_answer(Answer(None, False, silent, str(exc)))
            else:
                await self._on_answer(Answer(infos.get(job_id)))
        return self._status

    refresh = blocking(refresh_async)

    async def logs_async(self, node: str | None = None, tail: int = 100) -> str:
        """The job's output (``node=None``) or one node's Ray log, last ``tail`` lines."""
        return await self._job_dir().logs(self._status.job_id, node, tail)

    logs = blocking(logs_async)

    def job_client(self) -> Any:
        """A Ray Jobs client (``JobSubmissionClient``) through the dashboard, with the token."""
        from ray.job_submission import JobSubmissionClient

        if self.dashboard_url is None or self._token_path is None:
            raise ConnectError("connect() first: the dashboard address is not known yet")
        with open(self._token_path) as f:
            token = f.read().strip()
        return JobSubmissionClient(
            self.dashboard_url.rstrip("/"), headers={"X-Ray-Authorization": f"Bearer {token}"}
        )

    async def connection_info_async(self) -> ray_client.ConnectionInfo:
        """The head's address, ports and versions (``connection.json``), once READY."""
        return await self._load_connection()

    connection_info = blocking(connection_info_async)

    # -- submitting -----------------------------------------------------------------------
    async def _site(self) -> Site:
        site = await probe_site(self.transport, self.spec.job_dir_root)
        self.job_dir = self.job_dir or f"{site.job_dir_root.rstrip('/')}/{self.id}"
        return site

    def _render(self, site: Site) -> str:
        job_dir = self._job_dir()
        command = job_dir.bootstrap_command(self.spec.python)
        return render_job_script(
            self.spec,
            cluster_id=self.id,
            job_dir=job_dir.path,
            command=command,
            exported=site.exported,
        )

    async def _submit(self, job_dir: JobDir) -> str:
        try:
            return await submit_or_adopt(
                self.slurm, job_dir.file(SCRIPT), self.id, timeout=self.submit_timeout
            )
        except SlurmError:  # nothing was queued: leave nothing behind
            await self._forget_submission(job_dir)
            raise

    async def _forget_submission(self, job_dir: JobDir) -> None:
        self.registry.delete(self.id)
        await job_dir.remove()

    def _own(self, job_id: str) -> None:
        """Watch the job and keep its lease from now on (until it ends)."""
        _owned.add(self)
        watcher = watcher_for(self.transport, self.poll_interval)
        watcher.watch(job_id, self._on_answer)
        watcher.poll_soon()
        if not self._stopping:
            self.lease.keep(self._job_dir().write_lease)

    # -- following the job ----------------------------------------------------------------
    def _job_dir(self) -> JobDir:
        if self.job_dir is None:
            raise SlurmRayError(f"cluster {self.id} has no job dir yet")
        return JobDir(self.transport, self.job_dir)

    async def _on_answer(self, answer: Answer) -> None:
        """One poll's news: Slurm's answer (or silence) plus the job's new events."""
        log_tail = await self._follower.observe(answer, self._job_dir(), self.slurm)
        if self._follower.events.ready and self.connection is None:
            with contextlib.suppress(SlurmRayError):  # the record then has the head's address
                await self._load_connection()
        self._update_state(answer.job, log_tail)
        if self._status.state.is_final:
            self.lease.release()
            if self._status.job_id:
                watcher_for(self.transport).unwatch(self._status.job_id, self._on_answer)

    def _update_state(self, job: JobInfo | None = None, log_tail: str = "") -> None:
        status = self._follower.status(
            self._status,
            job,
            connected=self._connected,
            stopping=self._stopping,
            log_tail=log_tail,
            stop_notice=self._stop_notice,
        )
        if status.state.is_final and self._connected:
            self._connected = False
            log.warning(
                "cluster %s ended while connected (%s); Ray calls will fail until you connect "
                "to a running cluster",
                self.spec.name,
                status.describe(),
            )
            asyncio.get_running_loop().run_in_executor(None, ray_client.disconnect_ray_client)
        self._set_status(status)

    def _set_status(self, status: Status) -> None:
        changed = not status.same_as(self._status)
        if not changed and self.history:
            self._status = status
            return
        self._status = status = replace(status, at=time.time())
        self.history.append(status)
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
            target=self.transport.target,
            job_dir=self.job_dir or "",
            **record_fields(status),
            nodes_wanted=s.nodes,
            gpus_per_node=s.gpus_per_node,
            head_ip=info.head_ip if info else None,
            client_port=info.client_port if info else None,
            dashboard_port=info.dashboard_port if info else None,
            forwards={k: f.local_port for k, f in self._forwards.items() if f.is_open},
            detached=self._detached,
            spec=s.to_dict(),
            created_at=self.created_at,
        )
        try:
            self.registry.save(record)
        except (OSError, SlurmRayError) as exc:
            log.warning("could not save the record of %s: %s", self.id, exc)

    # -- connecting -----------------------------------------------------------------------
    async def _load_connection(self) -> ray_client.ConnectionInfo:
        if self.connection is None:
            text = await self._job_dir().read_connection()
            self.connection = ray_client.ConnectionInfo.from_json(text)
        return self.connection

    async def _local_token(self) -> str:
        if self._token_path is None:
            token = await self._job_dir().read_token()
            self._token_path = str(self.registry.store_token(self.id, token))
        return self._token_path

    async def _reach(self, name: str, host: str, port: int) -> Forward:
        fwd = self._forwards.get(name)
        if fwd is None or not fwd.is_open:
            fwd = await self.transport.forward(host, port)
            self._forwards[name] = fwd
            self._save_record()
        return fwd

    def _close_forwards(self) -> None:
        for fwd in self._forwards.values():
            fwd.close()
        self._forwards.clear()
        self._save_record()


@atexit.register
def _cancel_owned_clusters() -> None:
    """On interpreter exit, cancel the clusters this process owns, unless detached."""
    for cluster in list(_owned):
        if cluster._detached or cluster.state.is_final or cluster.job_id is None:
            continue
        with contextlib.suppress(Exception):
            run_sync(cluster.slurm.cancel(cluster.job_id), timeout=15)
            log.info("cancelled job %s of cluster %s at exit", cluster.job_id, cluster.id)
