"""The site's memory policy and whether a cluster fits in it, checked before submitting.

A site that enforces memory (cgroup's ``ConstrainRAMSpace=yes``, or ``OverMemoryKill``) kills a
job that goes over what it asked for, and a job that asks for nothing gets the site's default
(``DefMemPerCPU``/``DefMemPerNode``, of its partition or of the whole site). A Ray head needs
about a gigabyte beside its object store (``jsr_wire.ray_memory_mb``): at a default of 1 GB a
CPU, a 1-CPU head is killed while it starts, and the user would read a Ray traceback. So the
request is checked against the memory its nodes will get, and refused in one line that names
the setting, the figures and what to ask for. Where the site does not enforce memory nothing
is refused (the note says so).

Asked with two ``scontrol`` calls (``show config``, ``show partition -o``), kept a minute per
transport as the accounting is.
"""

from __future__ import annotations

import math
import re
import time
import weakref
from dataclasses import dataclass, field

from ..bootstrap.jsr_wire import (
    MIN_OBJECT_STORE_MB,
    OBJECT_STORE_SHARE,
    ray_memory_mb,
)
from ..errors import LimitError, SlurmError, TransportError
from ..scheduler.interface import Scheduler
from ..scheduler.records import Partition
from ..spec import ClusterSpec
from ..transport import Transport
from .client import SlurmClient

__all__ = [
    "MemoryPolicy",
    "check_memory",
    "job_memory",
    "load_memory_policy",
    "parse_memory_policy",
]

CACHE_SECONDS = 60.0
_CONFIG_LINE = re.compile(r"^(\w+)\s*=\s*(.*?)\s*$")
ROUND_MB = 512  # what is suggested is rounded up to this


@dataclass(frozen=True)
class MemoryPolicy:
    """What ``scontrol`` says of memory: whether it is enforced (and by what), the site's
    defaults, and each partition's own (per CPU, per node; None where not set)."""

    enforced_by: str | None = None  # e.g. "ConstrainRAMSpace=yes"; None: not enforced
    default_per_cpu: int | None = None  # MiB
    default_per_node: int | None = None
    partitions: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    unavailable: str | None = None  # why it is not known (then nothing is checked)


def _megabytes(value: str | None) -> int | None:
    """``1024`` → 1024; ``UNLIMITED``, ``0``, ``(null)`` or nothing → None."""
    if value is None:
        return None
    match = re.fullmatch(r"(\d+)M?", value.strip())
    return int(match.group(1)) or None if match else None


def parse_memory_policy(config: str, partitions: str) -> MemoryPolicy:
    """``scontrol show config`` and ``scontrol show partition -o``, as every supported Slurm
    (22.05-26.05) prints them."""
    settings = {}
    for line in config.splitlines():
        match = _CONFIG_LINE.match(line)
        if match:
            settings[match.group(1)] = match.group(2)
    enforced_by = None
    if "OverMemoryKill" in settings.get("JobAcctGatherParams", ""):
        enforced_by = "JobAcctGatherParams=OverMemoryKill"
    tasks = settings.get("TaskPlugin", "")
    if "task/cgroup" in tasks and settings.get("ConstrainRAMSpace", "").lower() == "yes":
        enforced_by = "ConstrainRAMSpace=yes"
    by_partition = {}
    for line in partitions.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "PartitionName" in fields:
            by_partition[fields["PartitionName"]] = (
                _megabytes(fields.get("DefMemPerCPU")),
                _megabytes(fields.get("DefMemPerNode")),
            )
    return MemoryPolicy(
        enforced_by,
        _megabytes(settings.get("DefMemPerCPU")),
        _megabytes(settings.get("DefMemPerNode")),
        by_partition,
    )


def job_memory(
    policy: MemoryPolicy, spec: ClusterSpec, partition: Partition | None
) -> tuple[int | None, str]:
    """The memory (MiB) each node of the job gets, and where that figure comes from."""
    if spec.mem_per_node:
        return spec.mem_per_node, f"mem_per_node={spec.mem_per_node}M"
    cpus = spec.cpus_per_node or 1
    own = policy.partitions.get(partition.name) if partition else None
    per_cpu, per_node = own or (None, None)
    where = f"partition {partition.name}'s" if partition else "the site's"
    if per_cpu is None and per_node is None:
        per_cpu, per_node, where = policy.default_per_cpu, policy.default_per_node, "the site's"
    if per_cpu:
        plural = "s" if cpus > 1 else ""
        return per_cpu * cpus, f"{where} DefMemPerCPU={per_cpu} × {cpus} CPU{plural}"
    if per_node:
        return per_node, f"{where} DefMemPerNode={per_node}"
    if partition is not None and partition.memory_mb:
        return partition.memory_mb, f"the whole node ({partition.memory_mb} MB: no default)"
    return None, "not known"


def needed_memory(spec: ClusterSpec) -> tuple[int, int, int]:
    """(MiB the head's job needs at least, Ray's processes' share, the object store's least)."""
    cpus = spec.cpus_per_node or 1
    ray = ray_memory_mb(True, cpus)
    store = -(-spec.object_store_memory // 1024**2) if spec.object_store_memory else None
    return ray + (store or MIN_OBJECT_STORE_MB), ray, store or MIN_OBJECT_STORE_MB


def suggested_memory(spec: ClusterSpec) -> str:
    """A request that leaves the head its object store: ``--mem 1.5G``-like."""
    need, ray, _ = needed_memory(spec)
    comfortable = need if spec.object_store_memory else ray / (1 - OBJECT_STORE_SHARE)
    rounded = math.ceil(max(need, comfortable) / ROUND_MB) * ROUND_MB
    return f"{rounded // 1024}G" if rounded % 1024 == 0 else f"{rounded / 1024:g}G"


def check_memory(
    spec: ClusterSpec, policy: MemoryPolicy, partition: Partition | None
) -> tuple[str, ...]:
    """LimitError when the site enforces memory and the head's node would get less than it
    needs; the notes of what was not checked."""
    if policy.unavailable:
        return (f"memory not checked: {policy.unavailable}",)
    if policy.enforced_by is None:
        return ()  # nothing is killed for its memory here
    have, where = job_memory(policy, spec, partition)
    if have is None:
        return ("memory not checked: the site's default memory per job is not known",)
    need, ray, store = needed_memory(spec)
    if have >= need:
        return ()
    cpus = spec.cpus_per_node or 1
    least = "" if spec.object_store_memory else "at least "
    message = (
        f"this site kills a job over its memory ({policy.enforced_by}) and each node of this one "
        f"would get {have} MB ({where}); a Ray head with {cpus} CPU{'s' if cpus > 1 else ''} "
        f"needs about {need} MB ({ray} for Ray's processes, {least}{store} for its object "
        f"store): ask for --mem {suggested_memory(spec)} (mem_per_node) or more"
    )
    raise LimitError("mem_per_node", spec.mem_per_node, message)


# per transport, per kind of scheduler asked
_cache: weakref.WeakKeyDictionary[Transport, dict[type[Scheduler], tuple[float, MemoryPolicy]]] = (
    weakref.WeakKeyDictionary()
)


async def load_memory_policy(
    transport: Transport, *, scheduler: Scheduler | None = None
) -> MemoryPolicy:
    """The site's memory policy, asked of ``scheduler`` (default: Slurm's two ``scontrol``),
    kept a minute per transport."""
    scheduler = scheduler or SlurmClient(transport)
    known = _cache.setdefault(transport, {})
    cached = known.get(type(scheduler))
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    try:
        config, partitions = await scheduler.memory_settings()
        policy = parse_memory_policy(config, partitions)
    except (SlurmError, TransportError) as exc:
        policy = MemoryPolicy(unavailable=f"scontrol did not say ({exc})")
    known[type(scheduler)] = (time.monotonic(), policy)
    return policy
