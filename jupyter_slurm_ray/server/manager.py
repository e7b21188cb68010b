"""The clusters the Jupyter server shows: registry records reconciled with Slurm, stop and create.

Plain asyncio, no web framework, so it is tested on its own. Listing never costs more than one
Slurm query per transport target per ``refresh_interval`` seconds, however many browsers poll:
concurrent callers share one in-flight refresh and later callers reuse its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..cluster import SlurmRayCluster
from ..errors import SlurmRayError, SpecError
from ..jobdir import EVENTS, JobDir, parse_events
from ..registry import ClusterRecord, Registry
from ..slurm import JobInfo, SlurmClient
from ..spec import ClusterSpec
from ..states import EventSummary, State, Status, derive_status, status_of_record
from ..transport import Transport, transport_for_target

log = logging.getLogger(__name__)

SpecResolver = Callable[[Mapping[str, Any], str | None], ClusterSpec]
TransportMaker = Callable[[], Transport]


class NotFound(SlurmRayError):
    """No cluster with that id in the registry."""


@dataclass
class Snapshot:
    """What Slurm said about every active job at one moment."""

    jobs: dict[str, JobInfo] = field(default_factory=dict)
    taken: float = 0.0  # time.monotonic()
    at: float = 0.0  # time.time(), shown to clients


class ClusterManager:
    """Lists, inspects, stops and creates clusters on behalf of the server's handlers."""

    def __init__(
        self,
        registry: Registry | None = None,
        *,
        refresh_interval: float = 3.0,
        resolve_spec: SpecResolver | None = None,
        make_transport: TransportMaker | None = None,
    ) -> None:
        self.registry = registry or Registry()
        self.refresh_interval = refresh_interval
        self._resolve_spec = resolve_spec
        self._make_transport = make_transport
        self._transports: dict[str, Transport] = {}
        self._snapshot = Snapshot()
        self._refreshing: asyncio.Task[Snapshot] | None = None
        self._owned: dict[str, SlurmRayCluster] = {}  # clusters this server created
        self.slurm_queries = 0  # Slurm queries made, one per target per refresh

    # -- reading ----------------------------------------------------------------------------
    async def list(self) -> dict[str, Any]:
        """Every cluster in the registry, newest last, with its state reconciled with Slurm."""
        records = self.registry.all()
        snapshot = await self._fresh_snapshot()
        return {
            "clusters": [self._view(r, snapshot) for r in records],
            "reconciled_at": snapshot.at,
            "slurm_queries": self.slurm_queries,
        }

    async def get(self, cluster_id: str, *, events: int = 50, log_lines: int = 100) -> dict:
        """One cluster with its recent bootstrap events and the tail of its job output."""
        record = self._record(cluster_id)
        snapshot = await self._fresh_snapshot()
        view = self._view(record, snapshot)
        transport = self.transport(record.target)
        view["events"] = await _recent_events(transport, record, events)
        view["log_tail"] = ""
        if record.job_id and record.job_dir:
            cluster = SlurmRayCluster.from_record(record, transport, registry=self.registry)
            try:
                view["log_tail"] = await cluster.logs_async(tail=log_lines)
            except SlurmRayError as exc:
                view["log_tail"] = f"(logs unavailable: {exc})"
        return view

    def transport(self, target: Mapping[str, Any]) -> Transport:
        """One transport per target, reused (one SSH connection per login node)."""
        key = json.dumps(target, sort_keys=True)
        transport = self._transports.get(key)
        if transport is None:
            transport = transport_for_target(dict(target))
            self._transports[key] = transport
        return transport

    # -- acting -----------------------------------------------------------------------------
    async def stop(self, cluster_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Cancel the cluster's job and wait until Slurm says it ended."""
        record = self._record(cluster_id)
        cluster = self._owned.pop(cluster_id, None)
        if cluster is None:
            self._expire_snapshot()
            snapshot = await self._fresh_snapshot()
            if reconcile(record, snapshot.jobs.get(record.job_id or "")).state.is_final:
                return self._view(record, snapshot)  # nothing left to stop
            transport = self.transport(record.target)
            cluster = SlurmRayCluster.from_record(record, transport, registry=self.registry)
        log.info("stopping cluster %s (job %s)", cluster_id, record.job_id)
        await cluster.down_async(timeout=timeout)
        self._expire_snapshot()
        return self._view(self._record(cluster_id), await self._fresh_snapshot())

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a cluster from a profile plus settings; this server owns it (lease)."""
        if not isinstance(body, Mapping):
            raise SpecError("body", body, "a JSON object of cluster settings")
        settings = dict(body)
        profile = settings.pop("profile", None)
        if profile is not None and not isinstance(profile, str):
            raise SpecError("profile", profile, "the name of a profile")
        spec = self._spec(settings, profile).require_complete()
        cluster = SlurmRayCluster(spec, self._new_transport(), registry=self.registry)
        await cluster.up_async(wait=False)
        self._owned[cluster.id] = cluster
        self._expire_snapshot()
        log.info("created cluster %s (job %s) from profile %s", cluster.id, cluster.job_id, profile)
        return self._view(self._record(cluster.id), Snapshot())

    def owns(self, cluster_id: str) -> bool:
        return cluster_id in self._owned

    async def close(self) -> None:
        for transport in self._transports.values():
            with contextlib.suppress(Exception):
                await transport.close()
        self._transports.clear()

    # -- internals --------------------------------------------------------------------------
    def _record(self, cluster_id: str) -> ClusterRecord:
        try:
            record = self.registry.load(cluster_id)
        except SlurmRayError:  # not even a valid id
            record = None
        if record is None:
            raise NotFound(f"no cluster {cluster_id!r} in the registry")
        return record

    def _spec(self, settings: dict[str, Any], profile: str | None) -> ClusterSpec:
        if self._resolve_spec is not None:
            return self._resolve_spec(settings, profile)
        from ..config import resolve_spec

        spec, _sources = resolve_spec(settings, profile=profile)
        return spec

    def _new_transport(self) -> Transport:
        if self._make_transport is not None:
            return self._make_transport()
        from ..config import make_transport

        return make_transport()

    def _expire_snapshot(self) -> None:
        """The next read asks Slurm again (after we changed something ourselves)."""
        self._snapshot = Snapshot(jobs=self._snapshot.jobs)

    async def _fresh_snapshot(self) -> Snapshot:
        age = time.monotonic() - self._snapshot.taken
        if age < self.refresh_interval and self._snapshot.taken:
            return self._snapshot
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        return await asyncio.shield(self._refreshing)

    async def _refresh(self) -> Snapshot:
        by_target: dict[str, tuple[dict[str, Any], list[str]]] = {}
        for record in self.registry.all():
            if record.job_id and not status_of_record(record).state.is_final:
                key = json.dumps(record.target, sort_keys=True)
                by_target.setdefault(key, (record.target, []))[1].append(record.job_id)
        jobs: dict[str, JobInfo] = {}
        results = await asyncio.gather(
            *(self._query(target, ids) for target, ids in by_target.values())
        )
        for found in results:
            jobs.update(found)
        self._snapshot = Snapshot(jobs=jobs, taken=time.monotonic(), at=time.time())
        return self._snapshot

    async def _query(self, target: dict[str, Any], job_ids: list[str]) -> dict[str, JobInfo]:
        self.slurm_queries += 1
        try:
            return await SlurmClient(self.transport(target)).query(job_ids)
        except SlurmRayError as exc:
            log.warning("asking Slurm about jobs %s failed: %s", ",".join(job_ids), exc)
            return {}

    def _view(self, record: ClusterRecord, snapshot: Snapshot) -> dict[str, Any]:
        job = snapshot.jobs.get(record.job_id or "")
        status = reconcile(record, job)
        return {
            "id": record.id,
            "name": record.name,
            "state": status.state.value,
            "reason": status.reason,
            "phase": status.phase if status.state is State.STARTING else None,
            "job_id": record.job_id,
            "slurm_state": job.state if job else None,
            "nodes": list(status.nodes),
            "nodes_wanted": record.nodes_wanted,
            "nodes_joined": status.nodes_joined,
            "gpus_per_node": record.gpus_per_node,
            "time_limit": status.time_limit,
            "time_left": status.time_left,
            "estimated_start": status.estimated_start.isoformat()
            if status.estimated_start
            else None,
            "owner": record.owner,
            "owner_host": record.owner_host,
            "owner_pid": record.owner_pid,
            "owner_alive": record.owner_alive,
            "server_owned": record.id in self._owned,
            "detached": record.detached,
            "target": _describe_target(record.target),
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "attach_command": f"%slurm_ray attach {record.name}",
        }


def reconcile(record: ClusterRecord, job: JobInfo | None) -> Status:
    """The record's state corrected by what Slurm says now (e.g. the job ended meanwhile)."""
    previous = status_of_record(record)
    state = previous.state
    if job is None:
        return previous
    events = EventSummary(phase=record.phase, joined=record.nodes_joined, ready=state.is_up)
    return derive_status(
        previous,
        job,
        events,
        connected=state is State.CONNECTED and record.owner_alive,
        stopping=state is State.STOPPING,
    )


def _describe_target(target: Mapping[str, Any]) -> str:
    if target.get("kind") == "ssh":
        user = f"{target['username']}@" if target.get("username") else ""
        port = f":{target['port']}" if target.get("port") else ""
        return f"ssh://{user}{target.get('host', '?')}{port}"
    return str(target.get("kind", "?"))


async def _recent_events(transport: Transport, record: ClusterRecord, count: int) -> list[dict]:
    if not record.job_dir:
        return []
    try:
        text = await transport.tail(JobDir(transport, record.job_dir).file(EVENTS), count)
    except SlurmRayError as exc:
        log.warning("reading the events of %s failed: %s", record.id, exc)
        return []
    return parse_events(text)
