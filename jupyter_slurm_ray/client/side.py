"""This process's side of a running cluster: what it needs to connect (``connection.json``,
the Ray token copied into the user's private state dir), its forwards to the head (through
SSH when remote), the way it connects (``client/mode.py``: Ray Client, or a Ray driver through
this host's own Ray node, ``client/drivernode.py``) and the connection itself.

The cluster's state machine (cluster.py) decides *when*; this module knows *how*.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..bootstrap.dashhttp import dashboard_url
from ..bootstrap.jsr_wire import CONNECTION_FILE, TlsFiles
from ..config import effective_setting
from ..errors import ConnectError
from ..job.directory import JobDir
from ..registry import Registry
from ..slurm.schedulers import scheduler_of
from ..spec import ClusterSpec
from ..transport import Forward, LocalTransport, Transport
from . import connect as ray_client
from .dashboardlink import link_proxied_dashboard
from .drivernode import DriverNode
from .jobaddress import point_ray_jobs_at, unpoint_ray_jobs
from .mode import (
    CLIENT,
    DRIVER,
    ConnectMode,
    KernelPlace,
    allowed_driver_hosts,
    driver_obstacle,
    job_dir_obstacle,
    nodes_reach,
    remote_target,
)
from .raydefaults import results_here_again, results_on_the_cluster

log = logging.getLogger(__name__)

HEAD_LOOK = 0.1  # how often a local job dir is looked at for connection.json while starting (s)


class ClientSide:
    """The connection details, forwards and Ray session of one cluster here.

    ``on_forwards_changed`` is called when a forward opens or closes (the record keeps the
    local ports, for the dashboard proxy and ``attach``). ``driver_hosts``: the hosts outside
    Slurm jobs where ``auto`` may try driver mode (``SlurmRay.driver_hosts``; None: its
    environment variable's, else every host).
    """

    def __init__(
        self,
        transport: Transport,
        registry: Registry,
        cluster_id: str,
        on_forwards_changed: Callable[[], None],
        driver_hosts: Sequence[str] | None = None,
    ) -> None:
        self.transport = transport
        self.registry = registry
        self.cluster_id = cluster_id
        self.connection: ray_client.ConnectionInfo | None = None
        self.forwards: dict[str, Forward] = {}
        self.connected = False
        self.token_path: str | None = None
        self.tls: TlsFiles | None = None  # this process's copy of the clients' certificate
        self.driver_hosts = driver_hosts
        self.mode: ConnectMode | None = None  # how this process is connected (once it is)
        self.driver: DriverNode | None = None  # this host's Ray node (driver mode)
        self._choice: asyncio.Future[ConnectMode] | None = None  # the mode, being chosen
        self._ray_imported: asyncio.Future[None] | None = None
        self._on_forwards_changed = on_forwards_changed
        # when the last connect reached each step (time.time()): benchmarks/driver_vs_client.py
        self.connect_steps: dict[str, float] = {}

    @property
    def dashboard_url(self) -> str | None:
        """The head's dashboard as this process reaches it (``https``: its relay, with TLS)."""
        tls = self.connection is not None and self.connection.tls
        fwd = self.forwards.get("dashboard")
        if fwd is not None:
            return dashboard_url(fwd.local_host, fwd.local_port, tls=tls)
        if self.connection is not None:
            info = self.connection
            return dashboard_url(info.head_ip, info.dashboard_port, tls=tls)
        return None

    @property
    def active(self) -> bool:
        """Connected, or preparing to (a mode being chosen, this host's Ray node running)."""
        return self.connected or self._choice is not None or self.driver is not None

    def open_forwards(self) -> dict[str, int]:
        """Local port of each open forward, by name (``client``, ``dashboard``)."""
        return {name: fwd.local_port for name, fwd in self.forwards.items() if fwd.is_open}

    async def load_connection(self, job_dir: JobDir) -> ray_client.ConnectionInfo:
        if self.connection is None:
            text = await job_dir.read_connection()
            self.connection = ray_client.ConnectionInfo.from_json(text)
        return self.connection

    # -- before the head answers ------------------------------------------------------------
    def import_ray_ahead(self) -> None:
        """``import ray`` in a thread now (seconds in a notebook), not once the head answers."""
        if self._ray_imported is None:
            self._ray_imported = asyncio.ensure_future(asyncio.to_thread(ray_client.import_ray))

    async def head_answers(self, job_dir: JobDir, seen: Callable[[], bool]) -> bool:
        """Once the job runs: True as soon as ``connection.json`` appears (the head answers),
        when the job dir is on this host's filesystem (a stat every HEAD_LOOK s, instead of
        the next read of the events); False at once when it is not, or once ``seen()``."""
        path = Path(job_dir.file(CONNECTION_FILE))
        if not isinstance(self.transport, LocalTransport) or not path.parent.is_dir():
            return False
        while not seen():
            if path.exists():
                return True
            await asyncio.sleep(HEAD_LOOK)
        return False

    def prepare(
        self, job_dir: JobDir, spec: ClusterSpec, job_id: str, setting: str | None = None
    ) -> None:
        """Start choosing how to connect (``setting``, else ``spec.connect``): for driver mode
        this host's Ray node starts at once, joining the head as soon as its GCS is verified."""
        if self._choice is None:
            chosen = self._choose(job_dir, spec, job_id, setting or spec.connect)
            self._choice = asyncio.ensure_future(chosen)

    async def choose(
        self, job_dir: JobDir, spec: ClusterSpec, job_id: str, setting: str | None = None
    ) -> ConnectMode:
        """How this process will connect (``prepare``, then its outcome); ConnectError when
        driver mode was asked and is not possible."""
        self.prepare(job_dir, spec, job_id, setting)
        assert self._choice is not None
        try:
            return await self._choice
        except BaseException:
            await self._forget_choice()
            raise

    async def _choose(
        self, job_dir: JobDir, spec: ClusterSpec, job_id: str, setting: str
    ) -> ConnectMode:
        if setting == CLIENT:
            return ConnectMode(CLIENT, "connect = client")
        if setting == DRIVER:
            obstacle = job_dir_obstacle(job_dir.path)
            if obstacle:
                raise ConnectError(f"connect = driver is not possible here: {obstacle}")
            ready = await self._driver_node(job_dir, spec)
            through = f"; through {ready.node_words}" if ready.through else ""
            return ConnectMode(DRIVER, f"connect = driver{through}")
        hosts = self.driver_hosts
        if hosts is None:
            hosts = effective_setting("driver_hosts")[0]
        place = KernelPlace.here(allowed_driver_hosts(hosts))
        obstacle = driver_obstacle(spec, job_dir.path, place, remote_target(self.transport))
        if obstacle:
            return ConnectMode(CLIENT, f"auto: {obstacle}")
        try:
            ready = await self._driver_node(job_dir, spec)
        except ConnectError as exc:
            first = str(exc).splitlines()[0]
            return ConnectMode(CLIENT, f"auto: {first}")
        failure = await nodes_reach(
            scheduler_of(self.transport, job_id),
            job_id,
            spec.nodes,
            ready.ip,
            ready.node_manager_port,
            spec.here_nodes,
        )
        if failure:
            await self._stop_driver()
            return ConnectMode(CLIENT, f"auto: {failure}")
        where = place.on_cluster_network() or "the cluster runs in this kernel's allocation"
        return ConnectMode(DRIVER, f"auto: {where}; the nodes reach {ready.node_words}")

    async def _driver_node(self, job_dir: JobDir, spec: ClusterSpec) -> Any:
        """This host's Ray node, started (once) and joined; stopped again if it fails."""
        if self.driver is None:
            self.driver = DriverNode(job_dir.path)
        try:
            return await self.driver.ready(spec.start_timeout + 30)
        except BaseException:
            await self._stop_driver()
            raise

    async def _stop_driver(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            await asyncio.to_thread(driver.stop)

    # -- connecting -------------------------------------------------------------------------
    async def connect(
        self,
        job_dir: JobDir,
        spec: ClusterSpec,
        job_id: str,
        *,
        timeout: float,
        attempts: int,
        setting: str | None = None,
    ) -> None:
        """Versions checked, token copied here, the mode chosen, forwards opened, then Ray
        Client or the driver's ``ray.init``."""
        steps = self.connect_steps = {"started": time.time()}
        self.prepare(job_dir, spec, job_id, setting)
        info = await self.load_connection(job_dir)
        ray_client.preflight(info)
        token_path = await self._local_token(job_dir)
        tls = await self.local_tls(job_dir)
        steps["read"] = time.time()  # connection.json, the token, the clients' certificate
        mode = await self.choose(job_dir, spec, job_id, setting)
        await self._reach("dashboard", info.head_ip, info.dashboard_port)
        steps["chosen"] = time.time()  # the mode (driver: this host's node joined, reach check)
        if self._ray_imported is not None:
            await self._ray_imported
        steps["imported"] = time.time()
        if mode.driver:
            try:
                await self._connect_driver(token_path, spec.name)
            except ConnectError as exc:
                if not mode.reason.startswith("auto"):
                    raise
                log.warning("driver mode failed, Ray Client instead: %s", exc)
                mode = ConnectMode(CLIENT, f"auto: the driver's connect failed: {exc}")
                self._choice = asyncio.get_running_loop().create_future()
                self._choice.set_result(mode)
        if not mode.driver:
            client = await self._reach("client", info.head_ip, info.client_port)
            address = f"ray://{client.local_host}:{client.local_port}"
            context = await asyncio.to_thread(
                ray_client.connect_ray_client,
                address,
                token_path,
                timeout=timeout,
                attempts=attempts,
                tls=tls,
                cluster=spec.name,
            )
            link_proxied_dashboard(context, self.cluster_id)
            results_on_the_cluster(await self.transport.home())  # Train's, Tune's
        steps["connected"] = time.time()
        self.mode = mode
        self.connected = True
        point_ray_jobs_at(spec.name)  # RAY_API_SERVER_ADDRESS: Ray's Jobs client means it

    async def _connect_driver(self, token_path: str, name: str) -> None:
        ready = self.driver.ready_info if self.driver is not None else None
        if ready is None or self.driver is None or not self.driver.running:
            await self._forget_choice()
            raise ConnectError("this kernel's Ray node stopped before the kernel connected")
        try:
            context = await asyncio.to_thread(
                ray_client.connect_driver,
                ready.gcs_address,
                token_path,
                node_ip=ready.ip,
                temp_dir=ready.temp_dir,
                tls=ready.tls,
                cluster=name,
            )
        except BaseException:
            await self._forget_choice()
            raise
        link_proxied_dashboard(context, self.cluster_id)

    async def disconnect(self) -> None:
        """Ray disconnected, then this host's Ray node (if any) stopped."""
        if self.connected:
            await asyncio.to_thread(ray_client.disconnect_ray_client)
            self.connected = False
            results_here_again()
            unpoint_ray_jobs()
        await self._forget_choice()

    async def _forget_choice(self) -> None:
        choice, self._choice = self._choice, None
        if choice is not None and not choice.done():
            choice.cancel()
            with contextlib.suppress(BaseException):
                await choice
        self.mode = None
        await self._stop_driver()

    def lost(self) -> None:
        """The cluster ended under a connected session: drop it without waiting."""
        self.connected = False
        driver, self.driver = self.driver, None
        choice, self._choice = self._choice, None
        if choice is not None:
            choice.cancel()
        self.mode = None

        results_here_again()
        unpoint_ray_jobs()

        def drop() -> None:
            ray_client.disconnect_ray_client()
            if driver is not None:
                driver.stop()

        asyncio.get_running_loop().run_in_executor(None, drop)

    def close_forwards(self) -> None:
        for fwd in self.forwards.values():
            fwd.close()
        self.forwards.clear()
        self._on_forwards_changed()

    def job_client(self) -> Any:
        """A Ray Jobs client (``JobSubmissionClient``) for this cluster's dashboard: straight
        to it (no proxy, no ``$RAY_ADDRESS``), with the token (``rayjobs``)."""
        from .rayjobs import DirectJobSubmissionClient

        if self.dashboard_url is None or self.token_path is None:
            raise ConnectError("connect() first: the dashboard address is not known yet")
        with open(self.token_path) as f:
            token = f.read().strip()
        ca = str(self.tls.ca) if self.tls is not None else None
        return DirectJobSubmissionClient(self.dashboard_url, token, ca_file=ca)

    async def _local_token(self, job_dir: JobDir) -> str:
        if self.token_path is None:
            token = await job_dir.read_token()
            self.token_path = str(self.registry.store_token(self.cluster_id, token))
        return self.token_path

    async def local_tls(self, job_dir: JobDir) -> TlsFiles | None:
        """This process's private copy of the cluster's CA and the clients' certificate (None
        for a cluster without TLS)."""
        info = await self.load_connection(job_dir)
        if info.tls and self.tls is None:
            cert, key, ca = await job_dir.read_client_tls()
            self.tls = self.registry.store_tls(self.cluster_id, cert, key, ca)
        return self.tls if info.tls else None

    async def dashboard_forward(self, job_dir: JobDir) -> Forward:
        """This process's way to the head's dashboard (a forward through SSH when remote)."""
        info = await self.load_connection(job_dir)
        return await self._reach("dashboard", info.head_ip, info.dashboard_port)

    async def _reach(self, name: str, host: str, port: int) -> Forward:
        fwd = self.forwards.get(name)
        if fwd is None or not fwd.is_open:
            fwd = await self.transport.forward(host, port)
            self.forwards[name] = fwd
            self._on_forwards_changed()
        return fwd
