"""Checks a spec against the site before anything is submitted: the partition (sinfo: MaxTime,
MaxNodes, node shape), the memory its nodes would get where the site enforces it (scontrol:
``memorypolicy.py``) and the user's accounting (sacctmgr: account, QOS and their limits).

Used by the magics, the panel and the server's POST. Without accounting the account and QOS
are not checked, and the answer says so and why; it never blocks on that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import SlurmUnavailable, SpecError
from ..scheduler.records import Partition
from ..spec import ClusterSpec, format_walltime
from ..transport import Transport
from .accounting import Accounting, load_accounting
from .hereplan import plan_here
from .limits import check_against_accounting
from .memorypolicy import MemoryPolicy, check_memory, load_memory_policy
from .schedulers import scheduler_for_mode

__all__ = [
    "SiteCheck",
    "check_against_partitions",
    "check_spec",
    "check_with_slurm",
    "chosen_partition",
    "describe_partition",
]


@dataclass(frozen=True)
class SiteCheck:
    """What a request was checked against, and what could not be checked (``notes``)."""

    partitions: list[Partition]
    accounting: Accounting
    notes: tuple[str, ...] = ()


def describe_partition(partition: Partition) -> str:
    """``debug* — 2/3 idle, max 1-00:00:00, 2 CPU, 2 GPU per node``."""
    limit = format_walltime(partition.max_time) if partition.max_time else "unlimited"
    parts = [
        f"{partition.idle_nodes}/{partition.total_nodes} idle",
        f"max {limit}",
        f"{partition.cpus_per_node} CPU",
    ]
    if partition.gpus_per_node:
        parts.append(f"{partition.gpus_per_node} GPU")
    state = "" if partition.available else " (down)"
    default = "*" if partition.is_default else ""
    return f"{partition.name}{default}{state} — {', '.join(parts)} per node"


def chosen_partition(spec: ClusterSpec, partitions: Sequence[Partition]) -> Partition | None:
    """The partition the job would run in: the one asked for, else the site's default."""
    by_name = {p.name: p for p in partitions}
    if spec.partition is not None:
        return by_name.get(spec.partition)
    return next((p for p in partitions if p.is_default), None)


def check_against_partitions(spec: ClusterSpec, partitions: Sequence[Partition]) -> None:
    """SpecError when the partition does not exist, or the request cannot fit it."""
    if not partitions:
        return
    if spec.partition is not None and spec.partition not in {p.name for p in partitions}:
        names = ", ".join(p.name + (" (default)" if p.is_default else "") for p in partitions)
        allowed = (
            f"a partition of this cluster: {names} "
            f"(sbatch would say: invalid partition specified: {spec.partition})"
        )
        raise SpecError("partition", spec.partition, allowed)
    chosen = chosen_partition(spec, partitions)
    if chosen is None:
        return
    name = chosen.name
    seconds = spec.time_seconds
    if seconds is not None and chosen.max_time is not None and seconds > chosen.max_time:
        limit = format_walltime(chosen.max_time)
        raise SpecError("time", spec.time, f"at most {limit} in partition {name} (MaxTime={limit})")
    if chosen.max_nodes is not None and spec.nodes > chosen.max_nodes:
        allowed = (
            f"at most {chosen.max_nodes} per job in partition {name} (MaxNodes={chosen.max_nodes})"
        )
        raise SpecError("nodes", spec.nodes, allowed)
    if chosen.total_nodes and spec.nodes > chosen.total_nodes:
        allowed = f"at most {chosen.total_nodes} in partition {name} (it has {chosen.total_nodes})"
        raise SpecError("nodes", spec.nodes, allowed)
    if spec.cpus_per_node and chosen.cpus_per_node and spec.cpus_per_node > chosen.cpus_per_node:
        allowed = f"at most {chosen.cpus_per_node} in partition {name} (CPUs of its nodes)"
        raise SpecError("cpus_per_node", spec.cpus_per_node, allowed)
    if spec.gpus_per_node > chosen.gpus_per_node:
        allowed = f"at most {chosen.gpus_per_node} in partition {name} (Gres of its nodes)"
        raise SpecError("gpus_per_node", spec.gpus_per_node, allowed)


def check_spec(
    spec: ClusterSpec,
    partitions: Sequence[Partition],
    accounting: Accounting,
    memory: MemoryPolicy | None = None,
) -> tuple[str, ...]:
    """Every check of ``spec`` against what the site said; the notes of what was skipped."""
    check_against_partitions(spec, partitions)
    chosen = chosen_partition(spec, partitions)
    notes = check_memory(spec, memory, chosen) if memory is not None else ()
    check_against_accounting(spec, accounting, chosen)
    if accounting.unavailable:
        return (*notes, f"account and QOS not checked: {accounting.unavailable}")
    return notes


async def check_with_slurm(spec: ClusterSpec, transport: Transport) -> SiteCheck:
    """Ask the mode's scheduler for its partitions, accounting and memory policy (Slurm's
    ``sinfo``, ``sacctmgr``, ``scontrol``; cached a minute) and check ``spec`` against them; a
    scheduler without them answers none, and the notes say what was not checked.

    Local mode asks Slurm nothing; when Slurm does not answer, the error says how to run
    without it (local mode), never falling back by itself."""
    kind = spec.scheduler_kind
    if kind.on_this_machine:
        note = f"{kind.system}: Ray runs as processes of this machine (one node); Slurm is not"
        note += " asked"
        return SiteCheck([], Accounting(unavailable=kind.system), (note,))
    if kind.in_allocation:  # nothing is submitted: the kernel's allocation is checked instead
        plan = await plan_here(transport, spec)
        return SiteCheck([], Accounting(unavailable=kind.system), plan.notes(spec))
    scheduler = scheduler_for_mode(spec.mode, transport)
    try:
        partitions = await scheduler.partitions()
    except SlurmUnavailable as exc:
        raise scheduler.unreachable(exc) from None
    accounting = await load_accounting(transport, scheduler=scheduler)
    memory = await load_memory_policy(transport, scheduler=scheduler)
    notes = check_spec(spec, partitions, accounting, memory)
    return SiteCheck(partitions, accounting, notes)
