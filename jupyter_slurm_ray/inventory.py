"""Every cluster of the registry reconciled with Slurm, and our jobs that no live record owns."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import SlurmRayError
from .registry import ClusterRecord, Registry
from .slurm import JobInfo, SlurmClient
from .states import EventSummary, State, Status, derive_status
from .transport import Transport, transport_for_target

log = logging.getLogger(__name__)

__all__ = ["JOB_TAG", "Entry", "Orphan", "find_orphans", "format_table", "reconcile"]

JOB_TAG = "jupyter-slurm-ray:"  # the job comment the job script sets, before the cluster id

TransportFor = Callable[[dict[str, Any]], Transport]


@dataclass(frozen=True)
class Entry:
    """One record with what Slurm says about its job right now."""

    record: ClusterRecord
    state: str
    job: JobInfo | None = None

    @property
    def owner(self) -> str:
        record = self.record
        if record.owner_pid == os.getpid():
            return "this process"
        if record.detached:
            return "detached"
        alive = record.owner_alive
        return f"pid {record.owner_pid}" + ("" if alive else " (gone)")

    @property
    def active(self) -> bool:
        return self.state not in {s.value for s in State if s.is_final} | {"UNKNOWN"}


@dataclass(frozen=True)
class Orphan:
    """A job of ours (by its comment tag) that no live record owns."""

    job_id: str
    cluster_id: str
    why: str


def _target_key(target: dict[str, Any]) -> str:
    return json.dumps(target, sort_keys=True)


async def reconcile(
    records: Iterable[ClusterRecord], transport_for: TransportFor = transport_for_target
) -> list[Entry]:
    """Entries for ``records``; one Slurm query per distinct target for the unfinished ones."""
    records = list(records)
    groups: dict[str, list[ClusterRecord]] = {}
    for record in records:
        if record.job_id and not State(record.state).is_final:
            groups.setdefault(_target_key(record.target), []).append(record)
    jobs: dict[str, JobInfo] = {}
    unknown_targets = set()
    for key, members in groups.items():
        try:
            slurm = SlurmClient(transport_for(members[0].target))
            jobs.update(await slurm.query([r.job_id for r in members if r.job_id]))
        except SlurmRayError as exc:
            log.warning("cannot ask Slurm about %s: %s", members[0].target, exc)
            unknown_targets.add(key)
    return [_entry(r, jobs, _target_key(r.target) in unknown_targets) for r in records]


def _entry(record: ClusterRecord, jobs: dict[str, JobInfo], unreachable: bool) -> Entry:
    state = State(record.state)
    if state.is_final or not record.job_id or unreachable:
        return Entry(record, record.state)
    job = jobs.get(record.job_id)
    if job is None:
        return Entry(record, "UNKNOWN")
    if job.is_final:
        previous = Status(state, job_id=record.job_id, nodes_wanted=record.nodes_wanted)
        return Entry(record, derive_status(previous, job, EventSummary()).state.value, job)
    if job.is_pending and state is not State.PENDING:
        return Entry(record, State.PENDING.value, job)
    return Entry(record, record.state, job)


def format_table(entries: Sequence[Entry]) -> str:
    """A plain-text table of entries (or a sentence when there are none)."""
    if not entries:
        return "no clusters"
    header = ("NAME", "ID", "JOB", "STATE", "NODES", "OWNER", "WHERE")
    rows = [header]
    for e in entries:
        r = e.record
        where = r.target.get("kind", "?")
        if r.target.get("host"):
            where += f" {r.target['host']}"
        nodes = f"{r.nodes_joined}/{r.nodes_wanted}"
        rows.append((r.name, r.id, r.job_id or "-", e.state, nodes, e.owner, where))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


async def find_orphans(transport: Transport, registry: Registry) -> list[Orphan]:
    """Our active jobs (tagged ``jupyter-slurm-ray:<id>``) whose record is missing, is for
    another job, or belongs to a process that is gone and did not detach."""
    tagged = await SlurmClient(transport).job_ids_with_comment(JOB_TAG)
    orphans = []
    for job_id, comment in sorted(tagged.items(), key=lambda item: int(item[0])):
        cluster_id = comment[len(JOB_TAG) :]
        why = _why_orphan(job_id, cluster_id, registry)
        if why:
            orphans.append(Orphan(job_id, cluster_id, why))
    return orphans


def _why_orphan(job_id: str, cluster_id: str, registry: Registry) -> str | None:
    try:
        record = registry.load(cluster_id)
    except SlurmRayError:
        return f"its tag names no valid cluster id ({cluster_id!r})"
    if record is None:
        return "no record of it"
    if record.job_id != job_id:
        return f"its record is for job {record.job_id}"
    if record.detached:
        return None
    if not record.owner_alive:
        return f"its owner (pid {record.owner_pid}) is gone and it was not detached"
    return None
