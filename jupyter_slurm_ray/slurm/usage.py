"""What a cluster's Slurm jobs used, from accounting (sacct): elapsed time, CPU- and GPU-hours
allocated, CPU efficiency, and the largest memory (RSS) seen on each node.

Written for a list of job ids (a cluster has one job today; worker jobs may come). Asked with
one ``sacct`` for all of them, on request only (status, the REST API, a cluster's end), never
while watching; an answer for jobs that all ended is final and kept, others for 30 s.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import SlurmError, TransportError
from ..scheduler.kinds import no_usage
from ..scheduler.records import FINAL_STATES, UsageRow
from ..transport import Transport
from .client import SlurmClient
from .formats import tres_amount

__all__ = ["Usage", "cached_usage", "fetch_usage", "fetch_usages", "usage_of_rows"]

LIVE_SECONDS = 30.0


@dataclass(frozen=True)
class Usage:
    """The usage of a set of jobs; ``unavailable`` says why there is none (no accounting)."""

    job_ids: tuple[str, ...]
    unavailable: str | None = None
    final: bool = False  # every job ended: the figures will not change
    elapsed: int = 0  # seconds, the longest allocation
    cpu_seconds: float = 0.0  # allocated: CPUs × elapsed, summed over the jobs
    gpu_seconds: float = 0.0  # allocated: GPUs × elapsed
    cpu_used: float = 0.0  # TotalCPU of the steps (Slurm records it when a step ends)
    max_rss_by_node: dict[str, int] = field(default_factory=dict)  # bytes
    # accounting has no record of the jobs yet: it may have soon (slurmdbd lags a little)
    unrecorded: bool = False

    @property
    def available(self) -> bool:
        return self.unavailable is None

    @property
    def cpu_hours(self) -> float:
        return self.cpu_seconds / 3600

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def cpu_efficiency(self) -> float | None:
        """CPU time used over CPU time allocated; known once the jobs ended."""
        if not self.final or self.cpu_seconds <= 0:
            return None
        return self.cpu_used / self.cpu_seconds

    @property
    def max_rss(self) -> tuple[str, int] | None:
        """The node with the largest RSS and that RSS in bytes."""
        if not self.max_rss_by_node:
            return None
        node = max(self.max_rss_by_node, key=lambda n: self.max_rss_by_node[n])
        return node, self.max_rss_by_node[node]

    def to_dict(self) -> dict[str, Any]:
        """What the REST API shows: the figures (the words are the notebook's and the
        labextension's)."""
        peak = self.max_rss
        return {
            "available": self.available,
            "unavailable": self.unavailable,
            "final": self.final,
            "job_ids": list(self.job_ids),
            "elapsed": self.elapsed,
            "cpu_hours": round(self.cpu_hours, 4),
            "gpu_hours": round(self.gpu_hours, 4),
            "cpu_used_seconds": round(self.cpu_used, 3),
            "cpu_efficiency": None
            if self.cpu_efficiency is None
            else round(self.cpu_efficiency, 4),
            "max_rss_by_node": dict(self.max_rss_by_node),
            "max_rss": peak[1] if peak else None,
            "max_rss_node": peak[0] if peak else None,
        }

    def compact(self) -> dict[str, Any]:
        """The listing's form: the figures a sidebar row shows."""
        full = self.to_dict()
        keys = ("available", "final", "cpu_hours", "gpu_hours", "cpu_efficiency", "max_rss")
        return {key: full[key] for key in keys}


def usage_of_rows(job_ids: Sequence[str], rows: Iterable[UsageRow]) -> Usage:
    """The arithmetic: allocations give elapsed, CPUs and GPUs; steps give CPU time and RSS
    (each step's MaxRSS is the largest task's, on MaxRSSNode)."""
    wanted = tuple(job_ids)
    allocations: dict[str, UsageRow] = {}
    steps: list[UsageRow] = []
    for row in rows:
        if row.allocation not in wanted:
            continue
        if row.step is None:
            allocations[row.allocation] = row
        else:
            steps.append(row)
    cpu_seconds = gpu_seconds = 0.0
    for alloc in allocations.values():
        cpus = tres_amount("cpu", alloc.alloc_tres.get("cpu", "")) or alloc.alloc_cpus
        gpus = tres_amount("gres/gpu", alloc.alloc_tres.get("gres/gpu", "")) or 0
        cpu_seconds += cpus * alloc.elapsed
        gpu_seconds += gpus * alloc.elapsed
    with_steps = {s.allocation for s in steps}
    cpu_used = sum(s.total_cpu for s in steps) + sum(
        a.total_cpu for a in allocations.values() if a.allocation not in with_steps
    )
    rss: dict[str, int] = {}
    for step in steps:
        node = step.max_rss_node or (step.nodes[0] if len(step.nodes) == 1 else None)
        if step.max_rss and node:
            rss[node] = max(rss.get(node, 0), step.max_rss)
    final = bool(allocations) and set(allocations) == set(wanted)
    final = final and all(a.state in FINAL_STATES for a in allocations.values())
    return Usage(
        job_ids=wanted,
        final=final,
        elapsed=max((a.elapsed for a in allocations.values()), default=0),
        cpu_seconds=cpu_seconds,
        gpu_seconds=gpu_seconds,
        cpu_used=cpu_used,
        max_rss_by_node=rss,
    )


_cache: weakref.WeakKeyDictionary[Transport, dict[tuple[str, ...], tuple[float, Usage]]] = (
    weakref.WeakKeyDictionary()
)


def cached_usage(transport: Transport, job_ids: Sequence[str]) -> Usage | None:
    """The last usage fetched for these jobs in this process, if any (no Slurm call)."""
    entry = _cache.get(transport, {}).get(tuple(job_ids))
    return entry[1] if entry else None


async def fetch_usage(
    transport: Transport, job_ids: Sequence[str], *, max_age: float = LIVE_SECONDS
) -> Usage:
    """The jobs' usage: one ``sacct`` unless this process knows it already (final, or
    younger than ``max_age`` s)."""
    key = tuple(j for j in job_ids if j)
    return (await fetch_usages(transport, [key], max_age=max_age))[key]


async def fetch_usages(
    transport: Transport, keys: Iterable[Sequence[str]], *, max_age: float = LIVE_SECONDS
) -> dict[tuple[str, ...], Usage]:
    """The usage of several sets of jobs (clusters) on one site: ONE ``sacct`` for all those
    this process does not know already."""
    known = _cache.setdefault(transport, {})
    wanted = [tuple(j for j in key if j) for key in keys]
    now = time.monotonic()
    stale = [
        key
        for key in dict.fromkeys(wanted)
        if key and not ((entry := known.get(key)) and (entry[1].final or now - entry[0] < max_age))
    ]
    for key in list(stale):
        why = no_usage(key)  # asked of each job's kind: local mode's, --here steps
        if why:
            known[key] = (now, Usage(key, unavailable=why))
            stale.remove(key)
    if stale:
        jobs = sorted({j for key in stale for j in key})
        try:
            rows = await SlurmClient(transport).usage(jobs)
        except (SlurmError, TransportError) as exc:
            why = f"Slurm's accounting did not answer ({exc})"
            found = {key: Usage(key, unavailable=why) for key in stale}
        else:
            found = {key: _usage_or_why(key, rows) for key in stale}
        for key, usage in found.items():
            known[key] = (time.monotonic(), usage)
    none = Usage((), unavailable="no Slurm job yet")
    return {key: known[key][1] if key else none for key in wanted}


def _usage_or_why(key: tuple[str, ...], rows: Sequence[UsageRow]) -> Usage:
    if not any(r.step is None and r.allocation in key for r in rows):
        return Usage(key, unavailable="sacct has no record of the job (yet)", unrecorded=True)
    return usage_of_rows(key, rows)
