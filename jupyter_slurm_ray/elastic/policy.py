"""The adaptive policy (issue 9, item 4), pure: Ray's unmet demand and the worker jobs as they
are → how many one-node worker jobs to submit, which idle ones to retire, what to report.

Nothing here asks Slurm or Ray: ``elastic/adapt.py`` reads Ray's autoscaler state (the dashboard's
``api/cluster_status``) and the worker jobs the cluster's watcher follows, calls
:func:`decide`, and applies the decision with ``WorkerJobs``. The rules:

- minimum and maximum count Ray nodes in all (the head's allocation + worker jobs);
- at most ``max_pending`` worker jobs wait in the queue at once; a pending job is never
  cancelled to be submitted again;
- a pending job whose Slurm reason says it can never start is reported once and then counted
  as not coming; while one exists, no job of the same shape is submitted;
- demand no worker node can hold (a bundle larger than a node, a STRICT_SPREAD placement group
  of more bundles than the maximum has nodes) is reported once, not looped on;
- a pending placement group asks for the nodes it lacks: its bundles first in the room the
  present nodes have (not those of worker jobs still settling: they count as coming), a
  STRICT_SPREAD group's bundles each on a node of its own (``raydemand.nodes_for``);
- a joined worker job whose node ran nothing for ``idle_timeout`` s is retired (drained),
  never below the minimum; the head's allocation is never retired.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import SpecError
from ..slurm.queueinfo import explain_reason
from ..spec.groups import DEFAULT_GROUP
from .adaptoptions import ADAPT_DEFAULTS
from .raydemand import Demand, PlacementDemand, Shape, describe_demand, nodes_for


# -- the settings ------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdaptSettings:
    """What ``adapt()`` was asked: node bounds (in all), idle seconds, pending jobs at once."""

    minimum: int
    maximum: int
    idle_timeout: float = ADAPT_DEFAULTS["idle_timeout"]
    max_pending: int = int(ADAPT_DEFAULTS["max_pending"])
    group: str = DEFAULT_GROUP

    def describe(self) -> str:
        """The status' first scaling line while adapting (words only: the record keeps
        :meth:`to_dict`)."""
        return (
            f"adapting {self.minimum}-{self.maximum} nodes (idle {self.idle_timeout:g} s, "
            f"at most {self.max_pending} pending)"
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings as the cluster's record keeps them (``adapting``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AdaptSettings | None:
        """The settings a record (or an adapt request) keeps; None when there are none or
        they are not settings (a record is read by other processes, of other versions)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return checked_settings(
                data.get("minimum"),
                data.get("maximum"),
                data.get("idle_timeout", ADAPT_DEFAULTS["idle_timeout"]),
                data.get("max_pending", ADAPT_DEFAULTS["max_pending"]),
                data.get("group"),
                1,
            )
        except SpecError:
            return None

    def refuses_scale(self, name: str) -> str:
        """Why ``scale`` is refused while adapting (the default group), and what to do."""
        return (
            f"{name} is adapting between {self.minimum} and {self.maximum} nodes: change that "
            "with `adapt --minimum N --maximum N`, or stop adapting with `adapt --off` first"
        )


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


Report = tuple[str, str]  # (key, message): told once per key


@dataclass(frozen=True)
class Decision:
    submit: int = 0
    retire: tuple[str, ...] = ()  # job ids, idle ones (drained) or surplus
    cause: str = ""  # why submit / retire
    reports: tuple[Report, ...] = ()
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
    demand: Demand,
    jobs: Sequence[JobView],
    *,
    quiet_for: float = 0.0,
    groups: Sequence[PlacementDemand] = (),
    room: Mapping[str, Mapping[str, float]] | None = None,
) -> Decision:
    """One decision. ``jobs``: the active worker jobs (not ended, not leaving);
    ``quiet_for``: seconds Ray has had no demand and no node has run anything (Ray's demand
    alone can read 0 for a moment while tasks still wait behind running ones); ``groups``:
    pending placement groups; ``room``: each Ray node's free resources (by IP)."""
    fitting, reports = _placeable(demand, shape)
    fitting_groups, group_reports = _placeable_groups(groups, shape, settings.maximum)
    reports += group_reports + _never_starting(jobs)
    total = head_nodes + len(jobs)
    blocked = any(job.never_starts for job in jobs)
    pending = sum(1 for job in jobs if job.pending and not job.never_starts)
    coming = sum(1 for job in jobs if job.coming)
    settling = {job.ip for job in jobs if job.coming and job.ip}  # counted as coming already
    free = [free for ip, free in (room or {}).items() if ip not in settling]
    waiting = bool(fitting or fitting_groups)
    needed = nodes_for(fitting, shape, fitting_groups, free) if waiting else 0
    submit, cause = 0, ""
    if total < settings.minimum:
        submit, cause = settings.minimum - total, f"below the minimum of {settings.minimum} nodes"
    elif needed > coming:
        submit, cause = needed - coming, describe_demand(fitting, fitting_groups)
    submit = max(0, min(submit, settings.maximum - total, settings.max_pending - pending))
    if blocked:
        submit = 0
    if submit:
        return Decision(submit, (), cause, tuple(reports), total + submit)
    retire, cause = _to_retire(settings, head_nodes, jobs, waiting, quiet_for)
    return Decision(0, retire, cause, tuple(reports), total - len(retire))


def _placeable(
    demand: Demand, shape: Shape
) -> tuple[list[tuple[Mapping[str, float], int]], list[Report]]:
    """The tasks' demand a worker node can hold, and a report for the rest."""
    fitting, reports = [], []
    for bundle, count in demand:
        why = shape.missing(bundle)
        if why is None:
            fitting.append((bundle, count))
        else:
            key = "unsatisfiable:" + ",".join(f"{k}={v:g}" for k, v in sorted(bundle.items()))
            reports.append((key, f"{count} × {dict(bundle)} can never be placed: {why}"))
    return fitting, reports


def _placeable_groups(
    groups: Sequence[PlacementDemand], shape: Shape, maximum: int
) -> tuple[list[PlacementDemand], list[Report]]:
    """The pending placement groups that nodes of ``shape`` can hold within ``maximum`` nodes,
    and a report for the rest."""
    fitting, reports = [], []
    for group in groups:
        why = next(filter(None, map(shape.missing, group.placed_as())), None)
        if why is None and group.strategy == "STRICT_SPREAD" and group.size() > maximum:
            why = f"each of its {group.size()} bundles needs a node of its own, at most {maximum}"
        if why is None:
            fitting.append(group)
        else:
            reports.append(
                (
                    f"unsatisfiable:{group.describe()}",
                    f"{group.describe()} can never be placed: {why}",
                )
            )
    return fitting, reports


def _never_starting(jobs: Sequence[JobView]) -> list[Report]:
    reports = []
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
    return reports


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
