"""The clusters the Jupyter server shows: the registry reconciled with Slurm, stop, create,
forget, extend, take over, and the housekeeping that leaves nothing behind.

Each view also carries the walltime (time left, whether the warning is due), the queue insight
of a pending cluster, and (on request, ``sacct`` answers kept by ``slurm/usage.py``) its usage.

Plain asyncio, no web framework, so it is tested on its own. Listing costs at most one Slurm
query per target per ``refresh_interval`` seconds, however many browsers poll (see
``inventory.Inventory``). Housekeeping, every ``housekeeping_interval`` seconds: cancel the
jobs of clusters whose owning process is known to be dead on this host (without waiting for
their lease to go stale; never one whose lease names a live owner), and forget ended clusters
older than the retention.

The server owns the clusters it created or took over (``take_over``), until another process
takes them over in turn (see ``ownership.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import usecases
from ..bootstrap.jsr_wire import Event
from ..cluster import SlurmRayCluster
from ..elastic.workerjobs import checked_node_count
from ..errors import NotFound, SlurmRayError, SpecError
from ..inventory import Entry, Inventory, tag_matches
from ..job.directory import JobDir
from ..naming import is_cluster_id
from ..ownership import live_owner
from ..registry import ClusterRecord, Registry
from ..slurm.queueinfo import QueueInsight, queue_insight
from ..slurm.schedulers import scheduler_of
from ..slurm.usage import Usage, fetch_usages
from ..slurm.walltime import parse_extension, warning_due
from ..spec import ClusterSpec
from ..states import Status, status_of_record
from ..targets import Transports
from ..transport import Transport
from .views import (
    ClusterView,
    ConnectionView,
    QueueView,
    UnreadableView,
    WalltimeAndQueueView,
    WorkerJobView,
)

log = logging.getLogger(__name__)

SpecResolver = Callable[[Mapping[str, Any], str | None], ClusterSpec]

DAY = 86400.0


class ClusterManager:
    """Lists, inspects, stops, creates and forgets clusters for the server's handlers."""

    def __init__(
        self,
        registry: Registry,
        transports: Transports,
        *,
        resolve_spec: SpecResolver,
        refresh_interval: float = 3.0,
        steady_poll_interval: float = 15.0,
        retention: float = 7 * DAY,
        housekeeping_interval: float = 10.0,
        adapt_defaults: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.registry = registry
        self.adapt_defaults = adapt_defaults  # the server's SlurmRay.adapt_* (config.py)
        self.transports = transports
        # A listing takes the user's shared queue answer up to a steady poll old: a cluster
        # that changes is watched by its owner, who asks Slurm often and shares the answer.
        self.inventory = Inventory(
            registry, transports, max_age=refresh_interval, shared_max_age=steady_poll_interval
        )
        self.retention = retention
        self.housekeeping_interval = housekeeping_interval
        self._resolve_spec = resolve_spec
        # the clusters this server created or took over (it owns those not taken over since)
        self._clusters: dict[str, SlurmRayCluster] = {}
        self._housekeeping: asyncio.Task[None] | None = None
        self.reaped: list[str] = []  # job ids cancelled because their owner was gone

    @property
    def slurm_queries(self) -> int:
        return self.inventory.slurm_queries

    # -- reading ----------------------------------------------------------------------------
    async def list(self, *, usage: bool = False) -> dict[str, Any]:
        """Every cluster in the registry, oldest first, with its state reconciled with Slurm;
        unreadable records last. With ``usage``, each carries the compact form of its usage
        (one ``sacct`` per target for the clusters whose usage is not known yet or is stale)."""
        entries = await self.inventory.entries()
        views = [self.view(e) for e in entries]
        if usage:
            found = await self._usages(entries)
            for view, entry in zip(views, entries, strict=True):
                known = found.get(entry.id)
                view["usage"] = known.compact() if known is not None else None
        return {
            "clusters": views,
            "reconciled_at": self.inventory.reconciled_at,
            "slurm_queries": self.slurm_queries,
        }

    def _from_record(self, record: ClusterRecord, transport: Transport) -> SlurmRayCluster:
        return SlurmRayCluster.from_record(
            record, transport, registry=self.registry, adapt_defaults=self.adapt_defaults
        )

    async def get(self, cluster_id: str, *, events: int = 50, log_lines: int = 100) -> dict:
        """One cluster with its recent bootstrap events, the tail of its job output and its
        usage (sacct)."""
        entry = await self._entry(cluster_id)
        view = self.view(entry)
        view["events"], view["log_tail"], view["usage"] = [], "", None
        record = entry.record
        if record is None or not record.job_dir or not self.transports.reaches(record.target):
            return view
        known = (await self._usages([entry])).get(entry.id)
        if known is not None:
            view["usage"] = known.to_dict()
        job_dir = JobDir(self.transports.for_target(record.target), record.job_dir)
        view["events"] = await _recent_events(job_dir, events)
        if any(e.get("event") == Event.WALLTIME_WARNING for e in view["events"]):  # the job's word
            warned = replace(entry.status, walltime_warning=True)
            view["walltime_warning"] = warning_due(warned, view["walltime_warning_seconds"])
        if record.job_id:
            try:
                view["log_tail"] = await job_dir.logs(record.job_id, None, log_lines)
            except SlurmRayError as exc:
                view["log_tail"] = f"(logs unavailable: {exc})"
        return view

    async def status(self, record: ClusterRecord) -> Status:
        """A record's status reconciled with Slurm (from the listing's shared snapshot)."""
        return await self.inventory.status_of(record)

    def transport(self, target: str) -> Transport:
        """The configured transport, if ``target`` (a record's) names it; else UnknownTarget."""
        return self.transports.for_target(target)

    # -- acting -----------------------------------------------------------------------------
    async def stop(self, cluster_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Cancel the cluster's job and wait until Slurm says it ended."""
        entry = await self._entry(cluster_id)
        record = entry.record
        if record is None:
            raise SpecError("id", cluster_id, "a readable record (this one can only be forgotten)")
        cluster = self._clusters.pop(cluster_id, None)
        if cluster is None:
            if not entry.active:
                return self.view(entry)  # nothing left to stop
            transport = self.transports.for_target(record.target)
            cluster = self._from_record(record, transport)
        log.info("stopping cluster %s (job %s)", cluster_id, record.job_id)
        await cluster.down_async(timeout=timeout)
        self.inventory.expire()
        return self.view(await self._entry(cluster_id))

    async def forget(self, cluster_id: str) -> dict[str, Any]:
        """Delete an ended (or unreadable) cluster's record; Conflict while it is active."""
        entry = await self._entry(cluster_id)
        usecases.forget(self.registry, [entry])
        self._clusters.pop(entry.id, None)
        return {"id": entry.id, "forgotten": True}

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a cluster from a profile plus settings, once the site check (partition,
        account, QOS, their limits) passed; this server owns it (lease)."""
        if not isinstance(body, Mapping):
            raise SpecError("body", body, "a JSON object of cluster settings")
        settings = dict(body)
        profile = settings.pop("profile", None)
        if profile is not None and not isinstance(profile, str):
            raise SpecError("profile", profile, "the name of a profile")
        spec = self._resolve_spec(settings, profile).require_complete()
        cluster = SlurmRayCluster(
            spec,
            self.transports.configured(),
            registry=self.registry,
            adapt_defaults=self.adapt_defaults,
        )
        notes = await usecases.submit(cluster, connect=False)  # kernels connect, not the server
        self._clusters[cluster.id] = cluster
        self.inventory.expire()
        log.info("created cluster %s (job %s) from profile %s", cluster.id, cluster.job_id, profile)
        view = self.view(await self._entry(cluster.id))
        view["checks"] = list(notes)
        return view

    async def extend(self, cluster_id: str, body: Any) -> dict[str, Any]:
        """Add walltime to an active cluster's job (``{"amount": "+30"}``); ExtendRefused with
        Slurm's words when the site does not allow it."""
        amount = body.get("amount") if isinstance(body, Mapping) else None
        parse_extension(amount)  # a bad amount is refused before anything is looked up
        entry = await self._entry(cluster_id)
        record = usecases.active_record(entry, "be extended")
        extension = await usecases.extend(self._held_or_from(record), amount, status=entry.status)
        log.info("extended job %s of %s by %d min", record.job_id, cluster_id, extension.minutes)
        self.inventory.expire()
        view = self.view(await self._entry(cluster_id))
        view["extended_by_minutes"] = extension.minutes
        return view

    async def adapt(self, cluster_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        """Adaptive scaling of an active cluster (``{"maximum": N, "minimum": N,
        "idle_timeout": S, "max_pending": N}``, or ``{"off": true}``): (its view, applied).
        A cluster this server owns adapts here; any other is asked of its owner."""
        if not isinstance(body, Mapping):
            raise SpecError("body", body, "a JSON object with maximum (and minimum), or off")
        unknown = set(body) - {"minimum", "maximum", "idle_timeout", "max_pending", "off"}
        if unknown:
            allowed = "minimum, maximum, idle_timeout, max_pending or off"
            raise SpecError(sorted(unknown)[0], body[sorted(unknown)[0]], allowed)
        off = body.get("off") is True
        if not off and body.get("maximum") is None:
            raise SpecError("maximum", None, "a whole number of Ray nodes in all (or off: true)")
        entry = await self._entry(cluster_id)
        record = usecases.active_record(entry, "adapt")
        low, high = body.get("minimum"), body.get("maximum")
        idle, pending = body.get("idle_timeout"), body.get("max_pending")
        cluster = self._held_or_from(record)
        _, applied = await cluster.adapt_or_ask_async(
            low, high, off=off, idle_timeout=idle, max_pending=pending
        )
        self.inventory.expire()
        return self.view(await self._entry(cluster_id)), applied

    async def scale(self, cluster_id: str, body: Any) -> tuple[dict[str, Any], bool]:
        """Scale an active cluster to ``{"nodes": N}`` Ray nodes in all: (its view, applied).
        A cluster this server owns is scaled here, at once (a scale-in returns once its drain
        began: the view's ``under_way`` and its scaling lines show it); any other is asked of
        its owner (a ``scale_request`` event; applied False). Conflict (409) while the cluster
        adapts (its bounds decide: change them, or stop adapting first)."""
        nodes = body.get("nodes") if isinstance(body, Mapping) else None
        count = checked_node_count(nodes, 0)  # a bad N is refused before anything is looked up
        group = body.get("group") if isinstance(body, Mapping) else None
        entry = await self._entry(cluster_id)
        cluster = self._held_or_from(usecases.active_record(entry, "be scaled"))
        applied = await usecases.scale(cluster, count, group, status=entry.status, wait=False)
        log.info("scaled %s to %s nodes (%s)", cluster_id, count, "here" if applied else "asked")
        self.inventory.expire()
        view = self.view(await self._entry(cluster_id))
        view["under_way"] = applied and bool(cluster.workers.draining())
        return view, applied

    async def take_over(self, cluster_id: str) -> dict[str, Any]:
        """Make this server the owner of an active cluster: it keeps its lease, applies its
        scale and adapt requests, and cancels it when the server stops (unless detached).
        Its previous owner stands down at its next lease renewal (``owned by pid N on …``)."""
        entry = await self._entry(cluster_id)
        record = usecases.active_record(entry, "be taken over")
        if not self.owns(cluster_id):
            cluster = self._clusters.get(cluster_id)  # held here, taken over since?
            if cluster is None:
                transport = self.transports.for_target(record.target)
                cluster = self._from_record(record, transport)
            await cluster.attach_async(takeover=True)
            self._clusters[cluster_id] = cluster
            previous = record.owner_process.describe()
            log.info("took over cluster %s (job %s) from %s", cluster_id, record.job_id, previous)
        self.inventory.expire()
        return self.view(await self._entry(cluster_id))

    def _held_or_from(self, record: ClusterRecord) -> SlurmRayCluster:
        """The cluster this server owns, else one made from its record (which asks its owner)."""
        owned = self._owned(record.id)
        if owned is not None:
            return owned
        return self._from_record(record, self.transports.for_target(record.target))

    def owns(self, cluster_id: str) -> bool:
        """This server owns the cluster (created or took it over, not taken over since)."""
        return self._owned(cluster_id) is not None

    def _owned(self, cluster_id: str) -> SlurmRayCluster | None:
        cluster = self._clusters.get(cluster_id)
        return cluster if cluster is not None and cluster.owned_here else None

    # -- housekeeping -----------------------------------------------------------------------
    def start_housekeeping(self) -> None:
        if self._housekeeping is None or self._housekeeping.done():
            loop = asyncio.get_running_loop()
            self._housekeeping = loop.create_task(self._housekeep_forever())

    async def _housekeep_forever(self) -> None:
        while True:
            try:
                await self.housekeep()
            except Exception:  # housekeeping must go on whatever one round hits
                log.exception("cluster housekeeping failed")
            await asyncio.sleep(self.housekeeping_interval)

    async def housekeep(self) -> None:
        """One round: cancel clusters whose owner died here, forget old ended ones. Slurm is
        asked (exactly) only when a record's owner is gone: a quiet round costs no query."""
        if any(self._owner_died_by_record(r) for r in self.registry.all()):
            self.inventory.expire()
            for entry in await self.inventory.entries():
                if self._owner_died(entry):
                    await self._reap(entry)
        self.registry.prune(self.retention)

    def _owner_died_by_record(self, record: ClusterRecord) -> bool:
        return (
            not record.is_final
            and not record.detached
            and record.job_id is not None
            and not self.owns(record.id)
            and record.owner_gone
        )

    def _owner_died(self, entry: Entry) -> bool:
        record = entry.record
        return (
            record is not None
            and entry.active
            and not entry.error
            and self._owner_died_by_record(record)
        )

    async def _reap(self, entry: Entry) -> None:
        record = entry.record
        assert record is not None and record.job_id is not None
        if not tag_matches(entry.job, record.id):
            log.warning(
                "not cancelling job %s of %s: Slurm does not show it tagged as that cluster",
                record.job_id,
                record.id,
            )
            return
        transport = self.transports.for_target(record.target)
        owner = await live_owner(JobDir(transport, record.job_dir), record, _owner_timeout(record))
        if owner is not None:  # another process took it over (its lease says so)
            log.info(
                "not cancelling job %s of %s: %s owns it",
                record.job_id,
                record.id,
                owner.describe(),
            )
            return
        log.warning(
            "cancelling job %s of cluster %s: its owner (pid %d) is gone and it was not detached",
            record.job_id,
            record.id,
            record.owner_pid,
        )
        slurm = scheduler_of(transport, record.job_id)
        with contextlib.suppress(SlurmRayError):
            await slurm.cancel(record.job_id)
            self.reaped.append(record.job_id)
        self.inventory.expire()

    async def close(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        await self.transports.close()

    # -- views ------------------------------------------------------------------------------
    async def _usages(self, entries: Sequence[Entry]) -> dict[str, Usage]:
        """Usage per cluster id, for the entries with a job on a target reached here."""
        by_target: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for entry in entries:
            record = entry.record
            if record is None or not record.job_id or not self.transports.reaches(record.target):
                continue
            if entry.status.state.value in ("SUBMITTING", "PENDING"):
                continue
            by_target.setdefault(record.target, []).append((entry.id, (record.job_id,)))
        found: dict[str, Usage] = {}
        for target, wanted in by_target.items():
            transport = self.transports.for_target(target)
            usages = await fetch_usages(transport, [key for _, key in wanted])
            found.update({cluster_id: usages[key] for cluster_id, key in wanted})
        return found

    async def _entry(self, cluster_id: str) -> Entry:
        for entry in await self.inventory.entries():
            if entry.id == cluster_id:
                return entry
        raise NotFound(f"no cluster {cluster_id!r} in the registry")

    def view(self, entry: Entry) -> dict[str, Any]:
        """What the REST API shows of one entry (the sidebar's row; answers add to it)."""
        return dict(self.typed_view(entry))

    def typed_view(self, entry: Entry) -> ClusterView | UnreadableView:
        """One entry's view as ``views.py`` declares it."""
        record, status, job = entry.record, entry.status, entry.job
        if record is None:
            return {
                "id": entry.id,
                "unreadable": True,
                "error": entry.error,
                "state": "UNREADABLE",
                "final": True,
                "forgettable": is_cluster_id(entry.id),  # not "(registry)", the directory
            }
        return {
            "id": record.id,
            "name": record.name,
            "state": status.state.value,
            "reason": status.reason,
            "notice": status.notice or entry.error,
            "phase": status.phase if status.state.value == "STARTING" else None,
            "job_id": record.job_id,
            "slurm_state": job.state if job else None,
            "slurm_unreachable_since": status.slurm_unreachable_since,
            "nodes": list(status.nodes),
            "nodes_wanted": record.nodes_wanted,
            "nodes_joined": status.nodes_joined,
            "nodes_lost": list(status.nodes_lost),
            "worker_jobs": _worker_jobs(record),
            "scaling": list(record.scaling),
            **_connection(record, status),
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
            "owner_term": record.owner_term,
            "observers": [{"pid": p.pid, "host": p.host} for p in record.observer_processes],
            "server_owned": self.owns(record.id),
            "can_take_over": not status.state.is_final
            and bool(record.job_id)
            and not self.owns(record.id),
            "detached": record.detached,
            "target": record.target,
            "reachable": entry.error is None,
            "unreadable": False,
            "error": None,
            "final": status.state.is_final,
            "forgettable": status.state.is_final,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "attach_command": f"%slurm_ray attach {record.name}",
            **_walltime_and_queue(record, status),
        }


def _owner_timeout(record: ClusterRecord) -> float:
    """The cluster's ``owner_timeout`` (how long its lease counts), the default if unreadable.
    A record written before the rename names it ``idle_timeout``: read as stored, silently."""
    try:
        return ClusterSpec.from_mapping(record.spec, stored=True).owner_timeout
    except SpecError:
        return ClusterSpec().owner_timeout


def _connection(record: ClusterRecord, status: Status) -> ConnectionView:
    """How the owner's kernel is connected ("driver" or "client") and why, while it is."""
    connected = status.state.value == "CONNECTED"
    mode = record.connect_mode if connected else None
    return {
        "connect_mode": "driver" if mode == "driver" else "client" if mode == "client" else None,
        "connect_reason": record.connect_reason if connected else None,
    }


def _worker_jobs(record: ClusterRecord) -> list[WorkerJobView]:
    """The worker jobs (scaling) Slurm may still run: job id, Slurm's state and reason, node."""
    return [
        WorkerJobView(
            job_id=job.job_id, state=job.state, reason=job.reason, host=job.host,
            joined=job.joined, estimated_start=job.estimated_start, group=job.group,
        )
        for job in status_of_record(record).worker_jobs
    ]  # fmt: skip


def _walltime_and_queue(record: ClusterRecord, status: Status) -> WalltimeAndQueueView:
    """The walltime warning (due now?), the queue insight of a pending cluster, and what the
    sidebar needs to offer Extend."""
    spec = record.spec or {}
    warning = spec.get("walltime_warning")
    warning_seconds = warning if isinstance(warning, int) and not isinstance(warning, bool) else 120
    partition = spec.get("partition") if isinstance(spec.get("partition"), str) else None
    queue = queue_insight(status, partition=partition, nodes=record.nodes_wanted)
    return {
        "walltime_warning": warning_due(status, warning_seconds),
        "walltime_warning_seconds": warning_seconds,
        "partition": partition,
        "account": spec.get("account") if isinstance(spec.get("account"), str) else None,
        "qos": spec.get("qos") if isinstance(spec.get("qos"), str) else None,
        "queue": _queue_view(queue) if queue is not None else None,
        "extendable": not status.state.is_final and bool(record.job_id),
    }


async def _recent_events(job_dir: JobDir, count: int) -> list[dict]:
    try:
        return await job_dir.recent_events(count)
    except SlurmRayError as exc:
        log.warning("reading the events of %s failed: %s", job_dir.path, exc)
        return []


def _queue_view(queue: QueueInsight) -> QueueView:
    start = queue.estimated_start
    return QueueView(
        reason=queue.reason, meaning=queue.meaning, action=queue.action,
        never_starts=queue.never_starts, hint=queue.hint,
        estimated_start=start.isoformat() if start else None,
    )  # fmt: skip
