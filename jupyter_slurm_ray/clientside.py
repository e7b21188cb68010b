"""This process's side of a running cluster: what it needs to connect (``connection.json``,
the Ray token copied into the user's private state dir), its forwards to the head (through
SSH when remote), and the Ray Client connection itself.

The cluster's state machine (cluster.py) decides *when*; this module knows *how*.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from . import connect as ray_client
from .bootstrap.dashhttp import dashboard_url
from .errors import ConnectError
from .jobdir import JobDir
from .registry import Registry
from .transport import Forward, Transport


class ClientSide:
    """The connection details, forwards and Ray Client session of one cluster here.

    ``on_forwards_changed`` is called when a forward opens or closes (the record keeps the
    local ports, for the dashboard proxy and ``attach``).
    """

    def __init__(
        self,
        transport: Transport,
        registry: Registry,
        cluster_id: str,
        on_forwards_changed: Callable[[], None],
    ) -> None:
        self.transport = transport
        self.registry = registry
        self.cluster_id = cluster_id
        self.connection: ray_client.ConnectionInfo | None = None
        self.forwards: dict[str, Forward] = {}
        self.connected = False
        self.token_path: str | None = None
        self._on_forwards_changed = on_forwards_changed

    @property
    def dashboard_url(self) -> str | None:
        fwd = self.forwards.get("dashboard")
        if fwd is not None:
            return dashboard_url(fwd.local_host, fwd.local_port)
        if self.connection is not None:
            return dashboard_url(self.connection.head_ip, self.connection.dashboard_port)
        return None

    def open_forwards(self) -> dict[str, int]:
        """Local port of each open forward, by name (``client``, ``dashboard``)."""
        return {name: fwd.local_port for name, fwd in self.forwards.items() if fwd.is_open}

    async def load_connection(self, job_dir: JobDir) -> ray_client.ConnectionInfo:
        if self.connection is None:
            text = await job_dir.read_connection()
            self.connection = ray_client.ConnectionInfo.from_json(text)
        return self.connection

    async def connect(self, job_dir: JobDir, timeout: float, attempts: int) -> None:
        """Versions checked, token copied here, forwards opened, then Ray Client."""
        info = await self.load_connection(job_dir)
        ray_client.preflight(info)
        token_path = await self._local_token(job_dir)
        client = await self._reach("client", info.head_ip, info.client_port)
        await self._reach("dashboard", info.head_ip, info.dashboard_port)
        address = f"ray://{client.local_host}:{client.local_port}"
        await asyncio.to_thread(
            ray_client.connect_ray_client, address, token_path, timeout=timeout, attempts=attempts
        )
        self.connected = True

    async def disconnect(self) -> None:
        if self.connected:
            await asyncio.to_thread(ray_client.disconnect_ray_client)
            self.connected = False

    def lost(self) -> None:
        """The cluster ended under a connected session: drop it without waiting."""
        self.connected = False
        asyncio.get_running_loop().run_in_executor(None, ray_client.disconnect_ray_client)

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
        return DirectJobSubmissionClient(self.dashboard_url, token)

    async def _local_token(self, job_dir: JobDir) -> str:
        if self.token_path is None:
            token = await job_dir.read_token()
            self.token_path = str(self.registry.store_token(self.cluster_id, token))
        return self.token_path

    async def _reach(self, name: str, host: str, port: int) -> Forward:
        fwd = self.forwards.get(name)
        if fwd is None or not fwd.is_open:
            fwd = await self.transport.forward(host, port)
            self.forwards[name] = fwd
            self._on_forwards_changed()
        return fwd
