"""Where the dashboard of a registered cluster is (its *backend*), and its Ray token, for the
dashboard proxy.

The only source of a proxy backend is the registry: a cluster id maps to the head address and
dashboard port written by the bootstrap (``connection.json`` in the job dir), reached directly on
the login node or through an SSH forward. Nothing in a request can name a host or a port.
The token stays in this process; it is never logged and never sent to the browser. A cluster
with TLS is reached through its head's relay, whose certificate must be the cluster CA's
(``tls_ca``): the token goes to nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..bootstrap.dashhttp import token_headers
from ..client.connect import ConnectionInfo
from ..errors import (
    DashboardUnavailable,
    NotFound,
    RegistryError,
    SlurmRayError,
    UnknownTarget,
)
from ..job.directory import JobDir
from ..registry import ClusterRecord, Registry
from ..states import State, Status
from ..transport import Forward, Transport
from .keepalive import KeepAliveClient

log = logging.getLogger(__name__)

# How long a record found not ended (by Slurm's shared snapshot too) is believed while its
# file is unchanged: the reconciliation is then not redone on every proxied request.
LIVE_VERDICT_SECONDS = 1.0

TransportLookup = Callable[[ClusterRecord], Transport]
StatusLookup = Callable[[ClusterRecord], Awaitable[Status]]


@dataclass(frozen=True)
class DashboardBackend:
    """The address the proxy connects to for one cluster, and the token it injects."""

    cluster_id: str
    host: str
    port: int
    token: str
    tls_ca: str | None = None  # the cluster's CA: the head's relay speaks https

    def token_headers(self) -> dict[str, str]:
        """The header that carries the token to the head, in the one form every caller sends."""
        return token_headers(self.token)


@dataclass
class _Cached:
    job_id: str | None
    info: ConnectionInfo
    token: str
    forward: Forward
    tls_ca: str | None = None


class DashboardBackends:
    """Resolves a cluster id to its dashboard, per request, with per-job caching."""

    def __init__(
        self,
        registry: Registry,
        transport_for: TransportLookup,
        status_of: StatusLookup | None = None,
        client: KeepAliveClient | None = None,
    ) -> None:
        self.registry = registry
        self._transport_for = transport_for
        self._status_of = status_of
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._records: dict[str, tuple[tuple[int, int, int], ClusterRecord]] = {}
        self._live_until: dict[str, tuple[ClusterRecord, float]] = {}  # not ended, until then
        self.client = client or KeepAliveClient()  # the proxy's connections to the heads

    async def resolve(self, cluster_id: str) -> DashboardBackend:
        record = self._record(cluster_id)
        verdict = self._live_until.get(cluster_id)
        if verdict is None or verdict[0] is not record or time.monotonic() >= verdict[1]:
            await self._refuse_ended(record)  # the record unchanged: asked again after a while
            self._live_until[cluster_id] = (record, time.monotonic() + LIVE_VERDICT_SECONDS)
        lock = self._locks.setdefault(cluster_id, asyncio.Lock())
        async with lock:
            cached = self._cache.get(cluster_id)
            try:
                transport = self._transport_for(record)
            except UnknownTarget as exc:
                raise DashboardUnavailable(f"cluster {record.name}: {exc}") from None
            if cached is None or cached.job_id != record.job_id:
                if cached is not None:  # a new job (requeued): not the old one's forward
                    self._release(cached)
                cached = await self._load(record, transport)
                self._cache[cluster_id] = cached
            if not cached.forward.is_open:
                # Our listener was closed: never let the token go to a port we do not hold.
                self._release(cached)
                info = cached.info
                cached.forward = await transport.forward(info.head_ip, info.dashboard_port)
        fwd = cached.forward
        if cached.tls_ca is not None:
            self.client.use_tls(fwd.local_host, fwd.local_port, cached.tls_ca)
        return DashboardBackend(
            cluster_id, fwd.local_host, fwd.local_port, cached.token, cached.tls_ca
        )

    async def _refuse_ended(self, record: ClusterRecord) -> None:
        """DashboardUnavailable when the cluster ended, by its record or by what Slurm says
        now (a record left READY by an owner that died is not believed)."""
        state = State(record.state)
        if not state.is_final and self._status_of is not None:
            state = (await self._status_of(record)).state
        if state.is_final:
            self.forget(record.id)
            raise DashboardUnavailable(
                f"cluster {record.name} (job {record.job_id}) is {state.value}: "
                "its dashboard is gone"
            )

    def forget(self, cluster_id: str) -> None:
        """Read the cluster's backend afresh next time: its forward closed, and the proxy's
        kept-alive connections to it (idle ones now, the others when their answer ends)."""
        self._live_until.pop(cluster_id, None)
        cached = self._cache.pop(cluster_id, None)
        if cached is not None:
            self._release(cached)

    def _release(self, cached: _Cached) -> None:
        self.client.drop(cached.forward.local_host, cached.forward.local_port)
        cached.forward.close()

    def _record(self, cluster_id: str) -> ClusterRecord:
        """The record, read again only when its file changed (one stat per request)."""
        try:
            info = os.stat(self.registry.record_path(cluster_id))
        except (OSError, SlurmRayError):
            info = None
        if info is not None:
            key = (info.st_mtime_ns, info.st_size, info.st_ino)
            cached = self._records.get(cluster_id)
            if cached is not None and cached[0] == key:
                return cached[1]
        record = self._read_record(cluster_id)
        if info is not None:
            self._records[cluster_id] = (key, record)
        return record

    def _read_record(self, cluster_id: str) -> ClusterRecord:
        try:
            record = self.registry.load(cluster_id)
        except RegistryError as exc:
            raise DashboardUnavailable(f"the record of {cluster_id} is unreadable: {exc}") from None
        except SlurmRayError:  # not even a cluster id
            record = None
        if record is None:
            raise NotFound(f"no cluster {cluster_id!r}")
        return record

    async def _load(self, record: ClusterRecord, transport: Transport) -> _Cached:
        if not record.job_dir:
            raise DashboardUnavailable(f"cluster {record.name} has no job directory yet")
        try:
            text = await JobDir(transport, record.job_dir).read_connection_if_ready()
            if text is None:
                raise DashboardUnavailable(f"cluster {record.name} is not ready yet")
            info = ConnectionInfo.from_json(text)
            token = await self._token(record, transport)
            tls_ca = await self._tls_ca(record, transport) if info.tls else None
            forward = await transport.forward(info.head_ip, info.dashboard_port)
        except DashboardUnavailable:
            raise
        except SlurmRayError as exc:
            raise DashboardUnavailable(f"cluster {record.name}: {exc}") from None
        log.info(
            "dashboard of %s: %s:%d via %s:%d",
            record.id,
            info.head_ip,
            info.dashboard_port,
            forward.local_host,
            forward.local_port,
        )
        return _Cached(record.job_id, info, token, forward, tls_ca)

    async def _tls_ca(self, record: ClusterRecord, transport: Transport) -> str:
        """The cluster's CA, as this user's private copy (the relay's certificate must be one
        it signed)."""
        copy = self.registry.tls_copy(record.id)
        if not copy.ca.exists():
            cert, key, ca = await JobDir(transport, record.job_dir).read_client_tls()
            copy = self.registry.store_tls(record.id, cert, key, ca)
        return str(copy.ca)

    async def _token(self, record: ClusterRecord, transport: Transport) -> str:
        token = self.registry.read_token(record.id)
        if token is None:
            token = await JobDir(transport, record.job_dir).read_token()
        if not token:
            raise DashboardUnavailable(f"cluster {record.name} has an empty Ray token")
        return token
