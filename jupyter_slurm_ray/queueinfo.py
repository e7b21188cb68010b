"""Why a cluster is still in the queue, in plain words: Slurm's pending reason explained, what to
do about it, Slurm's estimated start and a hint of what it waits for.

Pure: a table of the common reasons (``Priority``, ``Resources``, ``QOSMaxNodePerJobLimit``, …),
patterns for the families of QOS and association limits, and the request's own figures for the
hint ("waiting for 2 nodes in partition gpu"). Nothing here asks Slurm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .states import State, Status

__all__ = ["QueueInsight", "explain_reason", "queue_insight"]

_FEWER = "ask for fewer nodes (-N), CPUs (-c) or GPUs (-G), or another QOS (-q)"
_WAIT_OWN = "wait for your other jobs (or your group's) to finish, or stop some of them"

# Slurm's reason → (what it means, what to do, the job can never start as it is).
REASONS: dict[str, tuple[str, str, bool]] = {
    "Priority": (
        "jobs of higher priority are ahead of it",
        "wait; a smaller or shorter request may start sooner (backfill)",
        False,
    ),
    "Resources": (
        "the nodes it needs are busy",
        "wait (see the estimated start), or ask for fewer or smaller nodes or a shorter walltime",
        False,
    ),
    "QOSMaxNodePerJobLimit": (
        "it asks for more nodes than its QOS allows per job",
        "ask for fewer nodes (-N) or use another QOS (-q)",
        True,
    ),
    "QOSMaxCpuPerJobLimit": ("it asks for more CPUs than its QOS allows per job", _FEWER, True),
    "QOSMaxGRESPerJob": ("it asks for more GPUs than its QOS allows per job", _FEWER, True),
    "QOSMaxWallDurationPerJobLimit": (
        "its walltime is above its QOS's MaxWall",
        "ask for a shorter walltime (-t) or use another QOS (-q)",
        True,
    ),
    "QOSMaxJobsPerUserLimit": (
        "you already run as many jobs as its QOS allows per user",
        _WAIT_OWN,
        False,
    ),
    "QOSNotAllowed": (
        "its QOS may not be used with this account or partition",
        "use another QOS (-q)",
        True,
    ),
    "PartitionNodeLimit": (
        "it asks for more nodes than the partition allows (MaxNodes) or has",
        "ask for fewer nodes (-N) or use another partition (-p)",
        True,
    ),
    "PartitionTimeLimit": (
        "its walltime is above the partition's MaxTime",
        "ask for a shorter walltime (-t) or use another partition (-p)",
        True,
    ),
    "PartitionDown": ("its partition is down", "wait, or use another partition (-p)", False),
    "PartitionInactive": ("its partition is inactive", "use another partition (-p)", False),
    "AssocGrpCpuLimit": (
        "your account's group CPU limit (GrpTRES=cpu) is in use by running jobs",
        _WAIT_OWN + ", or use another account (-A)",
        False,
    ),
    "AssocGrpNodeLimit": (
        "your account's group node limit (GrpTRES=node) is in use by running jobs",
        _WAIT_OWN + ", or use another account (-A)",
        False,
    ),
    "AssocMaxJobsLimit": (
        "you already run as many jobs as your association allows (MaxJobs)",
        _WAIT_OWN,
        False,
    ),
    "AssocMaxWallDurationPerJobLimit": (
        "its walltime is above your association's MaxWall",
        "ask for a shorter walltime (-t)",
        True,
    ),
    "ReqNodeNotAvail": (
        "nodes it needs are unavailable (down, drained or reserved)",
        "wait for the site to bring them back, or use another partition (-p)",
        False,
    ),
    "NodeDown": ("a node it needs is down", "wait for the site to bring it back", False),
    "BeginTime": ("it was asked not to start before a given time (--begin)", "wait", False),
    "JobHeldUser": (
        "you (or a script of yours) held it",
        "release it: scontrol release JOBID",
        True,
    ),
    "JobHeldAdmin": ("an administrator held it", "ask your site's support", True),
    "Dependency": ("it waits for another job it depends on (--dependency)", "wait", False),
    "DependencyNeverSatisfied": (
        "the job it depends on failed: its dependency can never be met",
        "stop it (%slurm_ray down) and start it again without the dependency",
        True,
    ),
    "Reservation": ("it waits for its reservation to start", "wait", False),
    "BadConstraints": (
        "no node has the features it asks for (--constraint)",
        "check the constraint (-C)",
        True,
    ),
    "InvalidAccount": ("its account is not valid", "use one of your accounts (-A)", True),
    "InvalidQOS": ("its QOS is not valid", "use one of your QOSes (-q)", True),
    "Licenses": ("it waits for licenses", "wait", False),
    "Cleaning": ("a previous run of the job is still being cleaned up", "wait", False),
    "Prolog": ("the site's prolog is running on its nodes", "wait", False),
    "launch failed requeued held": (
        "its launch failed and Slurm held it",
        "stop it (%slurm_ray down) and ask your site's support if it happens again",
        True,
    ),
}

# Families: Slurm composes these names from the limit's owner, kind and resource.
_FAMILIES: tuple[tuple[re.Pattern[str], str, str, bool], ...] = (
    (
        re.compile(r"^(QOS|Assoc)Grp(\w+?)(RunMinutes|Minutes|Limit)?$"),
        "a group limit of your {owner} ({what}) is in use by running jobs",
        _WAIT_OWN,
        False,
    ),
    (
        re.compile(r"^(QOS|Assoc)Max(\w+?)PerJob(Limit)?$"),
        "it asks for more than your {owner} allows per job ({what})",
        _FEWER,
        True,
    ),
    (
        re.compile(r"^(QOS|Assoc)Max(\w+?)Per(User|Account)(Limit)?$"),
        "you already use as much as your {owner} allows ({what})",
        _WAIT_OWN,
        False,
    ),
)


@dataclass(frozen=True)
class QueueInsight:
    """A pending cluster's place in the queue, for humans."""

    reason: str  # Slurm's own reason, e.g. "Resources"
    meaning: str
    action: str | None
    never_starts: bool  # as requested, Slurm will not start it
    hint: str | None = None  # what it waits for, from the request
    estimated_start: datetime | None = None

    def short(self) -> str:
        """``Resources: the nodes it needs are busy``."""
        return f"{self.reason}: {self.meaning}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "meaning": self.meaning,
            "action": self.action,
            "never_starts": self.never_starts,
            "hint": self.hint,
            "estimated_start": self.estimated_start.isoformat() if self.estimated_start else None,
        }


def explain_reason(reason: str) -> tuple[str, str | None, bool]:
    """(meaning, what to do, never starts) of one of Slurm's pending reasons."""
    code, _, detail = reason.partition(",")
    code = code.strip()
    if code in REASONS:
        meaning, action, never = REASONS[code]
        if code == "ReqNodeNotAvail" and "UnavailableNodes:" in detail:
            nodes = detail.split("UnavailableNodes:", 1)[1].strip()
            meaning = f"{meaning}: {nodes}" if nodes else meaning
        return meaning, action, never
    for pattern, meaning, action, never in _FAMILIES:
        match = pattern.match(code)
        if match:
            owner = "QOS" if match.group(1) == "QOS" else "account (association)"
            return meaning.format(owner=owner, what=code), action, never
    return f"Slurm's reason: {reason}", None, False


def queue_insight(
    status: Status, *, partition: str | None = None, nodes: int | None = None
) -> QueueInsight | None:
    """The insight for a PENDING status (None otherwise, or without Slurm's reason)."""
    if status.state is not State.PENDING or not status.reason:
        return None
    meaning, action, never = explain_reason(status.reason)
    wanted = nodes or status.nodes_wanted
    hint = None
    if wanted and status.reason.split(",")[0] in ("Resources", "Priority", "ReqNodeNotAvail"):
        where = f"partition {partition}" if partition else "the default partition"
        hint = f"waiting for {wanted} node{'s' if wanted != 1 else ''} in {where}"
    return QueueInsight(status.reason, meaning, action, never, hint, status.estimated_start)
