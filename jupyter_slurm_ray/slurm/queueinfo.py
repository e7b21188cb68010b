"""Why a cluster is still in the queue, in plain words: Slurm's pending reason explained, what to
do about it, Slurm's estimated start and a hint of what it waits for.

Pure: a table of the common reasons (``Priority``, ``Resources``, ``QOSMaxNodePerJobLimit``, …,
in ``queue_reasons.toml``),
patterns for the families of QOS and association limits, and the request's own figures for the
hint ("waiting for 2 nodes in partition gpu"). Nothing here asks Slurm.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..states import State, Status

__all__ = ["QueueInsight", "explain_reason", "queue_insight", "reasons"]

_FEWER = "ask for fewer nodes (-N), CPUs (-c) or GPUs (-G), or another QOS (-q)"
_WAIT_OWN = "wait for your other jobs (or your group's) to finish, or stop some of them"


@functools.cache
def reasons() -> dict[str, tuple[str, str, bool]]:
    """Slurm's reason → (what it means, what to do, the job can never start as it is), from
    ``queue_reasons.toml`` beside this module (data: read once, when first needed)."""
    text = (Path(__file__).parent / "queue_reasons.toml").read_text(encoding="utf-8")
    return {
        code: (entry["meaning"], entry["action"], bool(entry["never_starts"]))
        for code, entry in tomllib.loads(text).items()
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


def explain_reason(reason: str) -> tuple[str, str | None, bool]:
    """(meaning, what to do, never starts) of one of Slurm's pending reasons."""
    code, _, detail = reason.partition(",")
    code = code.strip()
    if code in reasons():
        meaning, action, never = reasons()[code]
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
