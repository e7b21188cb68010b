"""What a front door asks of a cluster, each use case once: its checks, its refusals and what
it leaves behind when it fails. The magic, the panel, the CLI and the REST API call these and
only translate: arguments in, words or HTTP answers out.

- ``submit``: the spec complete and checked with the site (partition, account, QOS, their
  limits; mode 'here': the kernel's allocation) before anything is written, then the job
  submitted; a refused submit leaves no record (``SlurmRayCluster.up_async``'s clean-up).
- ``extend``, ``scale``: an active cluster only (``Conflict`` naming its state); its owner
  applies a scale, any other process asks it (``Elastic.scale_or_ask``).
- ``forget``: an ended (or unreadable) cluster's record only; its job dir stays.

``down`` and ``attach`` are the cluster's own (``down_async``, ``attach_async``), called as
they are by every front door; ``adapt`` is ``adapt_or_ask`` (``elastic/scaling.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .cluster import SlurmRayCluster
from .elastic.workerjobs import checked_node_count
from .errors import Conflict
from .inventory import Entry
from .registry import ClusterRecord, Registry
from .slurm.sitecheck import check_with_slurm
from .slurm.walltime import Extension, parse_extension
from .spec.groups import checked_name
from .states import Status

__all__ = ["Forgotten", "active_record", "extend", "forget", "scale", "submit"]

log = logging.getLogger(__name__)


async def submit(
    cluster: SlurmRayCluster, *, connect: bool = True, tell: Callable[[str], None] = log.info
) -> tuple[str, ...]:
    """Check the cluster's spec with the site, then submit its job (``up_async(wait=False)``):
    the site check's notes, each told first (``tell``) so that a refusal that follows has them
    beside it. ``connect``: whether the caller's process connects (the server's does not)."""
    spec = cluster.spec.require_complete()
    checked = await check_with_slurm(spec, cluster.transport)
    for note in checked.notes:
        tell(note)
    await cluster.up_async(wait=False, connect=connect)
    return checked.notes


def _require_active(cluster_id: str, status: Status, may: str) -> None:
    if status.state.is_final or status.job_id is None:
        raise Conflict(f"{cluster_id} is {status.state.value}: only an active cluster can {may}")


def active_record(entry: Entry, may: str) -> ClusterRecord:
    """The record of a listed cluster that is active (``may``: what only such a cluster can,
    "be scaled"); Conflict naming its state otherwise."""
    record = entry.record
    if record is None or not entry.active or not record.job_id:
        raise Conflict(f"{entry.id} is {entry.state}: only an active cluster can {may}")
    return record


async def extend(
    cluster: SlurmRayCluster, amount: object, *, status: Status | None = None
) -> Extension:
    """Add walltime (``"+30"`` minutes, ``"+1:00:00"``) to an active cluster's job.
    ``status``: its state as the caller reconciled it (default: asked of its scheduler now)."""
    minutes = parse_extension(amount)  # a bad amount is refused before Slurm is asked
    _require_active(cluster.id, status or await cluster.refresh_async(), "be extended")
    return await cluster.extend_async(minutes)


async def scale(
    cluster: SlurmRayCluster,
    nodes: object,
    group: object = None,
    *,
    status: Status | None = None,
    wait: bool = True,
) -> bool:
    """Scale an active cluster to ``nodes`` Ray nodes in all (or, with a worker ``group``, to
    ``nodes`` worker jobs of it): True when this process owns it and scaled it, False when it
    asked the owner. ``wait``: a scale-in returns once drained (else once its drain began).
    ``status``: its state as the caller reconciled it (default: the cluster's own; its owner
    keeps it current, and asks again before it scales)."""
    count = checked_node_count(nodes, 0)  # a bad N is refused before Slurm is asked
    named = None if group is None else checked_name("group", group)
    _require_active(cluster.id, status or cluster.status, "be scaled")
    return await cluster.scale_or_ask_async(count, named, wait=wait)


@dataclass(frozen=True)
class Forgotten:
    """A record deleted: the cluster's id and the state it had."""

    id: str
    state: str
    unreadable: bool


def forget(registry: Registry, entries: Iterable[Entry]) -> list[Forgotten]:
    """Delete the records of ended (or unreadable) clusters; Conflict, before any is deleted,
    when one of them is still active. Their job dirs, with the logs, stay."""
    chosen = list(entries)
    for entry in chosen:
        if entry.active:
            raise Conflict(f"{entry.id} is {entry.state}: stop it before forgetting it (down)")
    for entry in chosen:
        registry.delete(entry.id)
        log.info("forgot cluster %s (%s)", entry.id, entry.state)
    return [Forgotten(e.id, e.state, e.unreadable) for e in chosen]
