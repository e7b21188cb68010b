"""Every cluster of the registry reconciled with Slurm: the one view the CLI, the magics and the
server share, and our jobs that no live record owns.

Reconciling costs ONE Slurm query per target per refresh, shared by concurrent callers and
reused for ``max_age`` seconds (the server's many browsers), whatever the number of clusters;
the query itself is the user's shared queue (``slurm/queuecache.py``), so an answer one of their
kernels got a moment ago serves here too.
A record this process cannot reach (its target is not configured here) or cannot read is shown
as such, with its last known state; nothing in a record is ever executed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .errors import SlurmRayError, SlurmUnavailable, UnknownTarget
from .job.directory import JobDir
from .lease import LeaseSeen
from .naming import job_comment
from .ownership import Claim, claim_alive, read_lease
from .registry import ClusterRecord, Registry, Unreadable
from .scheduler.records import JobInfo
from .slurm.client import SlurmClient
from .slurm.queuecache import SharedQueue
from .slurm.schedulers import query_jobs
from .states import EventSummary, State, Status, derive_status, status_of_record
from .targets import Transports

log = logging.getLogger(__name__)

SHARED_MAX_AGE = 2.0  # seconds: how old a queue answer another process of the user got may be

__all__ = [
    "Entry",
    "Inventory",
    "Orphan",
    "find_orphans",
    "kept_by_their_owners",
    "reconcile",
]


@dataclass(frozen=True)
class Entry:
    """One record (or unreadable record file) with its state reconciled with Slurm now."""

    id: str
    record: ClusterRecord | None  # None: the file could not be read (see ``error``)
    status: Status
    job: JobInfo | None = None
    error: str | None = None  # why the record is unreadable, or its target unreachable

    @property
    def unreadable(self) -> bool:
        return self.record is None

    @property
    def state(self) -> str:
        return "UNREADABLE" if self.record is None else self.status.state.value

    @property
    def active(self) -> bool:
        return self.record is not None and not self.status.state.is_final

    @property
    def owner(self) -> str:
        """Who owns it (``this process``, ``pid 4242``, ``detached``…), and how many other
        processes observe it (``+1 observing``)."""
        record = self.record
        if record is None:
            return "?"
        if not record.owner_host:
            return "unknown"  # a record written without its owner's identity
        observing = len(record.observer_processes)
        return self._owner_of(record) + (f" +{observing} observing" if observing else "")

    @staticmethod
    def _owner_of(record: ClusterRecord) -> str:
        if record.owner_pid == os.getpid():
            return "this process"
        if record.detached:
            return "detached"
        return f"pid {record.owner_pid}" + (" (gone)" if record.owner_gone else "")


@dataclass
class _Snapshot:
    asked: set[str] = field(default_factory=set)  # the job ids Slurm was asked about
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    silent: dict[str, tuple[float, str]] = field(default_factory=dict)  # target -> since, why
    taken: float = 0.0  # time.monotonic()
    at: float = 0.0  # time.time()


def reconcile(
    record: ClusterRecord,
    job: JobInfo | None,
    *,
    answered: bool = True,
    silent_since: float | None = None,
) -> Status:
    """The record's status corrected by what Slurm says now (e.g. the job ended meanwhile).

    ``answered`` with ``job`` None: Slurm positively does not know the job (it ended long
    ago). Not ``answered``: Slurm was silent since ``silent_since``; the last known state
    stands, marked so.
    """
    previous = status_of_record(record)
    if previous.state.is_final or not record.job_id:
        return previous
    if not answered:
        return replace(previous, slurm_unreachable_since=silent_since)
    events = EventSummary(
        phase=record.phase, joined=record.nodes_joined, ready=previous.state.is_up
    )
    events.nodes_lost = list(record.nodes_lost)
    status = derive_status(
        replace(previous, slurm_unreachable_since=None),
        job,
        events,
        connected=previous.state is State.CONNECTED and record.owner_alive,
        stopping=previous.state is State.STOPPING,
        job_forgotten=job is None,
    )
    return status


class Inventory:
    """The registry's records reconciled with Slurm, one query per target per refresh."""

    def __init__(
        self,
        registry: Registry,
        transports: Transports,
        *,
        max_age: float = 0.0,
        shared_max_age: float = SHARED_MAX_AGE,
    ) -> None:
        self.registry = registry
        self.transports = transports
        self.max_age = max_age  # this process's snapshot is reused this long
        self.shared_max_age = shared_max_age  # the user's shared queue answer is taken this old
        self._queues: dict[str, SharedQueue] = {}
        self._exact = False
        self.slurm_queries = 0
        self._snapshot = _Snapshot()
        self._refreshing: asyncio.Task[_Snapshot] | None = None
        self._silent_since: dict[str, float] = {}

    @property
    def reconciled_at(self) -> float:
        return self._snapshot.at

    def expire(self) -> None:
        """The next read asks Slurm itself (after we changed something ourselves)."""
        self._snapshot = replace(self._snapshot, taken=0.0)
        self._exact = True

    async def entries(self) -> list[Entry]:
        """Every record, oldest first, then the unreadable ones."""
        records, unreadable = self.registry.scan()
        snapshot = await self._fresh(records)
        entries = [self._entry(record, snapshot) for record in records]
        for entry in entries:
            self._settle(entry)
        return entries + [_unreadable_entry(u) for u in unreadable]

    def _settle(self, entry: Entry) -> None:
        """Write an ended state into a record whose owner can no longer do it (gone, or not
        this process and not judged alive), so no record claims a cluster that is gone."""
        record = entry.record
        if record is None or record.is_final or not entry.status.state.is_final:
            return
        if record.owner_pid == os.getpid() or record.owner_process.alive:
            return  # the owner writes its own record
        record.state, record.reason = entry.status.state.value, entry.status.reason
        try:
            self.registry.save(record, create=False)
        except (OSError, SlurmRayError) as exc:
            log.warning("could not record that %s ended: %s", record.id, exc)

    async def status_of(self, record: ClusterRecord) -> Status:
        """One record's reconciled status, from the shared snapshot (refreshed, for all
        records, at most every ``max_age`` s): cheap enough for every proxied request."""
        snapshot = self._snapshot
        fresh = snapshot.taken and time.monotonic() - snapshot.taken < self.max_age
        if not fresh or (record.job_id and record.job_id not in snapshot.asked):
            snapshot = await self._fresh(self.registry.all())
        return self._entry(record, snapshot).status

    def _entry(self, record: ClusterRecord, snapshot: _Snapshot) -> Entry:
        if not self.transports.reaches(record.target):
            why = f"started through {record.target!r}, which this process is not configured for"
            return Entry(record.id, record, status_of_record(record), error=why)
        if record.job_id not in snapshot.asked:  # no news (e.g. submitted since the query)
            return Entry(record.id, record, status_of_record(record))
        job = snapshot.jobs.get(record.job_id or "")
        silent = snapshot.silent.get(record.target)
        if silent is not None and not record.is_final:
            status = reconcile(record, None, answered=False, silent_since=silent[0])
            return Entry(record.id, record, replace(status, notice=silent[1]), job)
        return Entry(record.id, record, reconcile(record, job), job)

    async def _fresh(self, records: Sequence[ClusterRecord]) -> _Snapshot:
        age = time.monotonic() - self._snapshot.taken
        unasked = {r.job_id for r in self._watched(records)} - self._snapshot.asked
        if self._snapshot.taken and age < self.max_age and not unasked:
            return self._snapshot
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh(list(records)))
        return await asyncio.shield(self._refreshing)

    def _watched(self, records: Sequence[ClusterRecord]) -> list[ClusterRecord]:
        """The records whose job Slurm is asked about: active, on a target reached here."""
        return [
            r for r in records if r.job_id and not r.is_final and self.transports.reaches(r.target)
        ]

    async def _refresh(self, records: list[ClusterRecord]) -> _Snapshot:
        by_target: dict[str, list[str]] = {}
        for record in self._watched(records):
            assert record.job_id is not None
            by_target.setdefault(record.target, []).append(record.job_id)
        snapshot = _Snapshot(taken=time.monotonic(), at=time.time())
        snapshot.asked = {j for ids in by_target.values() for j in ids}
        max_age = 0.0 if self._exact else self._shared_age_for(self._watched(records))
        self._exact = False
        for target, job_ids in by_target.items():
            self.slurm_queries += 1
            try:
                transport = self.transports.for_target(target)
                slurm = SlurmClient(transport, shared=self._queue(target))
                snapshot.jobs.update(await query_jobs(slurm, job_ids, max_age=max_age))
                self._silent_since.pop(target, None)
            except (SlurmUnavailable, UnknownTarget) as exc:
                since = self._silent_since.setdefault(target, time.time())
                snapshot.silent[target] = (since, str(exc))
                log.warning("Slurm did not answer about %s: %s", ",".join(job_ids), exc)
        self._snapshot = snapshot
        return snapshot

    def _shared_age_for(self, records: Sequence[ClusterRecord]) -> float:
        """How old the user's shared queue answer may be: never older than the newest change
        of a record asked about (an answer from before it says nothing of what it claims now,
        e.g. a job that ended just before its record was written)."""
        newest = max((r.updated_at for r in records), default=0.0)
        return max(0.0, min(self.shared_max_age, time.time() - newest))

    def _queue(self, target: str) -> SharedQueue:
        """The user's queue on ``target``, shared with their kernels through the state dir."""
        if target not in self._queues:
            self._queues[target] = SharedQueue(self.registry.path, target)
        return self._queues[target]


def _unreadable_entry(item: Unreadable) -> Entry:
    status = Status(State.FAILED, reason=f"unreadable record: {item.error}")
    return Entry(item.id, None, status, error=item.error)


# -- orphans ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Orphan:
    """A job of ours (by its comment tag) that no live record owns."""

    job_id: str
    cluster_id: str
    why: str


async def find_orphans(slurm: SlurmClient, registry: Registry) -> list[Orphan]:
    """Our active jobs (tagged ``jupyter-slurm-ray:<id>``) whose record is missing, is for
    another job, or belongs to a process that is gone and did not detach; and worker jobs
    (tagged ``jupyter-slurm-ray-worker:<id>``) that no live record lists. A job whose record
    exists but cannot be read is never offered: it may well be alive."""
    tagged = await slurm.tagged_jobs()
    records, unreadable = registry.scan()
    by_id = {r.id: r for r in records}
    unreadable_ids = {u.id for u in unreadable}
    if "(registry)" in unreadable_ids:
        raise SlurmRayError(f"the registry cannot be trusted: {unreadable[0].error}")
    orphans = []
    for job_id, cluster_id in sorted(tagged.items(), key=lambda item: int(item[0])):
        if cluster_id in unreadable_ids:
            continue
        why = _why_orphan(job_id, by_id.get(cluster_id))
        if why:
            orphans.append(Orphan(job_id, cluster_id, why))
    workers = await slurm.tagged_worker_jobs()
    for job_id, cluster_id in sorted(workers.items(), key=lambda item: int(item[0])):
        why = _why_worker_orphan(job_id, by_id.get(cluster_id))
        if why and cluster_id not in unreadable_ids:
            orphans.append(Orphan(job_id, cluster_id, why))
    return orphans


async def kept_by_their_owners(
    slurm: SlurmClient, orphans: Sequence[Orphan]
) -> dict[str, LeaseSeen]:
    """Of ``orphans``, the jobs whose lease, in the job dir Slurm runs them in, a live owner
    still renews: a kernel elsewhere (a laptop over SSH, another login node) that keeps its
    own registry. Job id -> that lease. Their owner keeps them: they are no orphans."""
    if not orphans:
        return {}
    directories = await slurm.work_dirs()
    offered = [o.job_id for o in orphans if o.job_id in directories]
    leases = await asyncio.gather(
        *(read_lease(JobDir(slurm.transport, directories[job_id])) for job_id in offered)
    )
    return {
        job_id: lease
        for job_id, lease in zip(offered, leases, strict=True)
        if lease is not None and claim_alive(Claim(lease.owner, lease.term, lease), math.inf)
    }


def _why_worker_orphan(job_id: str, record: ClusterRecord | None) -> str | None:
    """A worker job (scaling) no live cluster owns: it would also leave by itself once its
    head or owner is gone."""
    if record is None:
        return "a worker job without a record of its cluster"
    if record.is_final:
        return f"a worker job of a cluster that ended ({record.state})"
    if job_id not in {str(job.get("job_id")) for job in record.worker_jobs}:
        return "a worker job its cluster's record does not list"
    if not record.detached and record.owner_gone:
        return f"a worker job whose cluster's owner (pid {record.owner_pid}) is gone"
    return None


def _why_orphan(job_id: str, record: ClusterRecord | None) -> str | None:
    if record is None:
        return "no record of it"
    if record.job_id != job_id:
        return f"its record is for job {record.job_id}"
    if record.detached:
        return None
    if record.owner_gone:
        return f"its owner (pid {record.owner_pid}) is gone and it was not detached"
    return None


def tag_matches(job: JobInfo | None, cluster_id: str) -> bool:
    """The job really is this cluster's (its comment carries the cluster's tag)."""
    return job is not None and job.comment == job_comment(cluster_id)
