"""The adaptive policy (issue 9, item 4), pure: Ray's unmet demand and the worker jobs as they
are → how many one-node worker jobs to submit, which idle ones to retire, what to report.

Nothing here asks Slurm or Ray: ``adapt.py`` reads Ray's autoscaler state (the dashboard's
``api/cluster_status``) and the worker jobs the cluster's watcher follows, calls
:func:`decide`, and applies the decision with ``WorkerJobs``. The rules:

- minimum and maximum count Ray nodes in all (the head's allocation + worker jobs);
- at most ``max_pending`` worker jobs wait in the queue at once; a pending job is never
  cancelled to be submitted again;
- a pending job whose Slurm reason says it can never start is reported once and then counted
  as not coming; while one exists, no job of the same shape is submitted;
- demand no worker node can hold (a bundle larger than a node) is reported once, not looped on;
- a joined worker job whose node ran nothing for ``idle_timeout`` s is retired (drained),
  never below the minimum; the head's allocation is never retired.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError
from .queueinfo import explain_reason
from .workergroups import DEFAULT_GROUP

MAX_BUNDLES = 1000  # demand instances packed at most (the maximum caps the nodes anyway)
# Resources Ray gives every node of the head's shape (its memory and object store: not sized).
_IGNORED = ("objectStoreMemory", "object_store_memory")
_ALIASES = {"CPU": "CPU", "GPU": "GPU", "memory": "memory"}


# -- the settings ------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdaptSettings:
    """What ``adapt()`` was asked: node bounds (in all), idle seconds, pending jobs at once."""

    minimum: int
    maximum: int
    idle_timeout: float = 60.0
    max_pending: int = 2
    group: str = DEFAULT_GROUP

    def describe(self) -> str:
        """The status' first scaling line while adapting (read back by :meth:`from_line`)."""
        return (
            f"adapting {self.minimum}-{self.maximum} nodes (idle {self.idle_timeout:g} s, "
            f"at most {self.max_pending} pending)"
        )

    @classmethod
    def from_line(cls, line: str) -> AdaptSettings | None:
        """The settings a :meth:`describe` line shows (a record's first scaling line, read by
        another process), else None."""
        found = _DESCRIBED.fullmatch(line)
        if found is None:
            return None
        low, high, idle, pending = found.groups()
        return cls(int(low), int(high), float(idle), int(pending))

    def refuses_scale(self, name: str) -> str:
        """Why ``scale`` is refused while adapting (the default group), and what to do."""
        return (
            f"{name} is adapting between {self.minimum} and {self.maximum} nodes: change that "
            "with `adapt --minimum N --maximum N`, or stop adapting with `adapt --off` first"
        )


_DESCRIBED = re.compile(r"adapting (\d+)-(\d+) nodes \(idle ([0-9.e+]+) s, at most (\d+) pending\)")


def _whole(name: str, value: object, least: int) -> int:
    allowed = f"a whole number, at least {least}"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SpecError(name, value, allowed)
    return value


def checked_settings(
    minimum: object,
    maximum: object,
    idle_timeout: object,
    max_pending: object,
    group: object,
    head_nodes: int,
) -> AdaptSettings:
    """The settings, each checked (SpecError naming the field, one line)."""
    if group not in (None, DEFAULT_GROUP):
        allowed = f"'{DEFAULT_GROUP}': adapt scales the default worker jobs; scale another group "
        "with scale(n, group=...)"
        raise SpecError("group", group, allowed)
    low = _whole("minimum", minimum, head_nodes)
    high = _whole("maximum", maximum, 1)
    if high < low:
        raise SpecError("maximum", maximum, f"a whole number, at least the minimum ({low})")
    idle = idle_timeout
    if isinstance(idle, str):
        try:
            idle = float(idle)
        except ValueError:
            raise SpecError("idle_timeout", idle_timeout, "seconds, more than 0") from None
    if isinstance(idle, bool) or not isinstance(idle, int | float) or not 0 < idle < math.inf:
        raise SpecError("idle_timeout", idle_timeout, "seconds, more than 0")
    pending = _whole("max_pending", max_pending, 1)
    return AdaptSettings(low, high, float(idle), pending)


# -- what Ray says ---------------------------------------------------------------------------
Bundle = Mapping[str, float]


@dataclass(frozen=True)
class Shape:
    """One worker job's Ray node: what a new node brings."""

    cpus: float
    gpus: float = 0.0
    memory: float | None = None  # bytes, None: not sized

    def missing(self, bundle: Bundle) -> str | None:
        """Why one node of this shape cannot hold ``bundle`` (None: it can)."""
        for name, amount in bundle.items():
            if name in _IGNORED or amount <= 0:
                continue
            have = self.capacity().get(_ALIASES.get(name, name))
            if have is None:
                return f"worker nodes have no {name} resource"
            if amount > have + 1e-9:
                return f"a worker node has {have:g} {name}, not {amount:g}"
        return None

    def capacity(self) -> dict[str, float]:
        room = {"CPU": self.cpus, "GPU": self.gpus}
        if self.memory is not None:
            room["memory"] = self.memory
        return room

    def describe(self) -> str:
        return f"{self.cpus:g} CPU, {self.gpus:g} GPU"


@dataclass(frozen=True)
class RayView:
    """Ray's autoscaler state, as far as the policy needs it."""

    demand: tuple[tuple[dict[str, float], int], ...]  # bundle, count (tasks, actors, PGs)
    busy: dict[str, bool]  # node IP -> it runs something (CPU or GPU in use)
    head_shape: Shape | None  # the head's node (a worker job is one node of its shape)
    at: float = 0.0  # when the autoscaler wrote it


def _bundles(entries: object) -> Iterable[tuple[dict[str, float], int]]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], dict):
            bundle, count = entry
            if isinstance(count, int) and count > 0:
                yield {str(k): float(v) for k, v in bundle.items() if _number(v)}, count


def _placement_groups(entries: object) -> Iterable[tuple[dict[str, float], int]]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], dict):
            group, count = entry
            for bundle, per_group in _bundles(group.get("bundles")):
                yield bundle, per_group * (count if isinstance(count, int) else 1)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _used(usage: Mapping[str, Any], name: str) -> float:
    pair = usage.get(name)
    return float(pair[0]) if isinstance(pair, list) and pair and _number(pair[0]) else 0.0


def _total(usage: Mapping[str, Any], name: str) -> float | None:
    pair = usage.get(name)
    return float(pair[1]) if isinstance(pair, list) and len(pair) > 1 else None


def parse_cluster_status(data: Mapping[str, Any]) -> RayView:
    """The dashboard's ``api/cluster_status`` answer (its ``data``) → demand and node usage."""
    status = data.get("clusterStatus") or {}
    report = status.get("loadMetricsReport") or {}
    demand = [
        *_bundles(report.get("resourceDemand")),
        *_placement_groups(report.get("pgDemand")),
        *_bundles(report.get("requestDemand")),
    ]
    busy: dict[str, bool] = {}
    head_shape = None
    for usage in (report.get("usageByNode") or {}).values():
        if not isinstance(usage, dict):
            continue
        ips = [
            key.split(":", 1)[1] for key in usage if key.startswith("node:") and key[5:6].isdigit()
        ]
        if "node:InternalHead" in usage or "node:__internal_head__" in usage:
            head_shape = Shape(
                _total(usage, "CPU") or 0.0, _total(usage, "GPU") or 0.0, _total(usage, "memory")
            )
        for ip in ips:
            busy[ip] = _used(usage, "CPU") > 0 or _used(usage, "GPU") > 0
    at = status.get("time")
    when = float(at) if isinstance(at, int | float) else 0.0
    return RayView(tuple(demand), busy, head_shape, when)


def nodes_for(demand: Sequence[tuple[Mapping[str, float], int]], shape: Shape) -> int:
    """How many nodes of ``shape`` hold the demand (first fit, largest first)."""
    instances: list[Mapping[str, float]] = []
    for bundle, count in demand:
        instances += [bundle] * min(count, MAX_BUNDLES - len(instances))
    instances.sort(key=lambda b: (b.get("GPU", 0.0), b.get("CPU", 0.0)), reverse=True)
    room: list[dict[str, float]] = []
    for bundle in instances:
        need = {_ALIASES[k]: v for k, v in bundle.items() if k in _ALIASES and v > 0}
        for node in room:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
                break
        else:
            node = shape.capacity()
            room.append(node)
        for k, v in need.items():
            node[k] = node.get(k, 0.0) - v
    return len(room)


def describe_demand(demand: Sequence[tuple[Mapping[str, float], int]]) -> str:
    """``3 pending tasks/actors need 3 CPU`` (placement groups' bundles counted too)."""
    count = sum(n for _, n in demand)
    totals: dict[str, float] = {}
    for bundle, n in demand:
        for name, amount in bundle.items():
            if name not in _IGNORED:
                totals[name] = totals.get(name, 0.0) + amount * n
    needs = ", ".join(f"{v:g} {k}" for k, v in sorted(totals.items())) or "nothing sized"
    return f"{count} pending task{'s' if count != 1 else ''}/actors need {needs}"


# -- the worker jobs as the policy sees them ---------------------------------------------------
@dataclass(frozen=True)
class JobView:
    job_id: str
    pending: bool  # PENDING in Slurm
    reason: str | None = None  # Slurm's pending reason
    joined: bool = False  # its Ray node joined
    ip: str | None = None  # its Ray node's address, once joined
    idle_for: float = 0.0  # seconds its node ran nothing (0: busy or not joined)
    settling: bool = False  # joined too recently for Ray's demand to show it

    @property
    def never_starts(self) -> bool:
        return self.pending and bool(self.reason) and explain_reason(self.reason or "")[2]

    @property
    def coming(self) -> bool:
        """It will add a node Ray's demand does not count yet."""
        return (not self.joined or self.settling) and not self.never_starts


@dataclass(frozen=True)
class Decision:
    submit: int = 0
    retire: tuple[str, ...] = ()  # job ids, idle ones (drained) or surplus
    cause: str = ""  # why submit / retire
    reports: tuple[tuple[str, str], ...] = ()  # (key, message): told once each
    wanted: int = 0  # nodes in all the policy wants now


@dataclass
class Memory:
    """What the loop remembers between decisions."""

    reported: set[str] = field(default_factory=set)
    quiet_since: float | None = None  # since when nothing waits and nothing runs in Ray


def decide(
    settings: AdaptSettings,
    head_nodes: int,
    shape: Shape,
    demand: Sequence[tuple[Mapping[str, float], int]],
    jobs: Sequence[JobView],
    *,
    quiet_for: float = 0.0,
) -> Decision:
    """One decision. ``jobs``: the active worker jobs (not ended, not leaving);
    ``quiet_for``: seconds Ray has had no demand and no node has run anything (Ray's demand
    alone can read 0 for a moment while tasks still wait behind running ones)."""
    reports: list[tuple[str, str]] = []
    fitting = []
    for bundle, count in demand:
        why = shape.missing(bundle)
        if why is None:
            fitting.append((bundle, count))
        else:
            key = "unsatisfiable:" + ",".join(f"{k}={v:g}" for k, v in sorted(bundle.items()))
            reports.append((key, f"{count} × {dict(bundle)} can never be placed: {why}"))
    for job in jobs:
        if job.never_starts:
            meaning = explain_reason(job.reason or "")[0]
            reports.append(
                (
                    f"never:{job.job_id}",
                    f"worker job {job.job_id} PENDING ({job.reason}): {meaning}; "
                    "it will never start; not retried",
                )
            )
    total = head_nodes + len(jobs)
    blocked = any(job.never_starts for job in jobs)
    pending = sum(1 for job in jobs if job.pending and not job.never_starts)
    coming = sum(1 for job in jobs if job.coming)
    needed = nodes_for(fitting, shape) if fitting else 0
    submit, cause = 0, ""
    if total < settings.minimum:
        submit, cause = settings.minimum - total, f"below the minimum of {settings.minimum} nodes"
    elif needed > coming:
        submit, cause = needed - coming, describe_demand(fitting)
    submit = max(0, min(submit, settings.maximum - total, settings.max_pending - pending))
    if blocked:
        submit = 0
    if submit:
        return Decision(submit, (), cause, tuple(reports), total + submit)
    retire, cause = _to_retire(settings, head_nodes, jobs, bool(fitting), quiet_for)
    return Decision(0, retire, cause, tuple(reports), total - len(retire))


def _to_retire(
    settings: AdaptSettings,
    head_nodes: int,
    jobs: Sequence[JobView],
    demand: bool,
    quiet_for: float,
) -> tuple[tuple[str, ...], str]:
    total = head_nodes + len(jobs)
    if total > settings.maximum:  # the maximum was lowered: pending ones first
        surplus = sorted(jobs, key=lambda j: (not j.pending, j.job_id))
        extra = tuple(j.job_id for j in surplus[: total - settings.maximum])
        return extra, f"above the maximum of {settings.maximum} nodes"
    room = total - settings.minimum
    if room <= 0 or demand:
        return (), ""
    idle = [j for j in jobs if j.joined and j.idle_for >= settings.idle_timeout]
    waiting: list[JobView] = []
    if quiet_for >= settings.idle_timeout:  # no demand for long: pending ones are not needed
        waiting = [j for j in jobs if j.pending and not j.never_starts]
    chosen = (waiting + idle)[:room]
    if not chosen:
        return (), ""
    causes = []
    pending_ids = [j.job_id for j in chosen if j.pending]
    if pending_ids:
        causes.append(
            f"worker job {', '.join(pending_ids)} PENDING, nothing to run for {quiet_for:.0f} s"
        )
    idle_ones = [j for j in chosen if not j.pending]
    if idle_ones:
        worst = max(j.idle_for for j in idle_ones)
        what = ", ".join(j.job_id for j in idle_ones)
        causes.append(f"worker job {what} idle {worst:.0f} s")
    return tuple(j.job_id for j in chosen), "; ".join(causes)
