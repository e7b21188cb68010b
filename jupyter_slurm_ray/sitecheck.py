"""Checks a spec against the site's partitions (sinfo) before anything is submitted."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import SpecError
from .slurm import Partition, SlurmClient
from .spec import ClusterSpec, format_walltime
from .transport import Transport

__all__ = ["check_against_partitions", "check_with_slurm", "describe_partition"]


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


def check_against_partitions(spec: ClusterSpec, partitions: Sequence[Partition]) -> None:
    """SpecError when the partition does not exist, or the request cannot fit it."""
    if not partitions:
        return
    by_name = {p.name: p for p in partitions}
    if spec.partition is not None and spec.partition not in by_name:
        names = ", ".join(p.name + (" (default)" if p.is_default else "") for p in partitions)
        raise SpecError("partition", spec.partition, f"a partition of this cluster: {names}")
    chosen = by_name.get(spec.partition or "") or next(
        (p for p in partitions if p.is_default), None
    )
    if chosen is None:
        return
    seconds = spec.time_seconds
    if seconds is not None and chosen.max_time is not None and seconds > chosen.max_time:
        allowed = f"at most {format_walltime(chosen.max_time)} in partition {chosen.name}"
        raise SpecError("time", spec.time, allowed)
    if chosen.total_nodes and spec.nodes > chosen.total_nodes:
        allowed = f"at most {chosen.total_nodes} in partition {chosen.name}"
        raise SpecError("nodes", spec.nodes, allowed)
    if spec.cpus_per_node and chosen.cpus_per_node and spec.cpus_per_node > chosen.cpus_per_node:
        allowed = f"at most {chosen.cpus_per_node} in partition {chosen.name}"
        raise SpecError("cpus_per_node", spec.cpus_per_node, allowed)
    if spec.gpus_per_node > chosen.gpus_per_node:
        allowed = f"at most {chosen.gpus_per_node} in partition {chosen.name}"
        raise SpecError("gpus_per_node", spec.gpus_per_node, allowed)


async def check_with_slurm(spec: ClusterSpec, transport: Transport) -> list[Partition]:
    """Ask sinfo for the partitions and check ``spec`` against them; return the partitions."""
    partitions = await SlurmClient(transport).partitions()
    check_against_partitions(spec, partitions)
    return partitions
