"""The walltime people notice: when the warning is due, and extending a job's time limit.

Slurm sends the bootstrap SIGUSR1 ``walltime_warning`` seconds before the end (its
``walltime_warning`` event); Slurm may send it up to a minute early. After an extension the
warning no longer applies. Extending is ``scontrol update TimeLimit=+N``, which many sites allow
only to operators: a refusal carries Slurm's words and what to do instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ExtendRefused, SlurmRayError, SpecError
from ..scheduler.interface import Scheduler
from ..spec.checks import parse_walltime
from ..states import Status

__all__ = [
    "AMOUNT_ALLOWED",
    "Extension",
    "extend_walltime",
    "parse_extension",
    "refusal_advice",
    "warning_due",
]

SIGNAL_SLACK = 60  # Slurm may send the warning signal up to this much early
AMOUNT_ALLOWED = (
    "minutes to add, like +30, or a Slurm duration like +1:00:00 or +1-00:00:00 "
    "(a walltime can only be extended here, not shortened)"
)


def parse_extension(amount: object) -> int:
    """Whole minutes to add from ``+30``, ``30``, ``+1:30:00`` or an int; SpecError naming
    ``amount`` otherwise."""
    if isinstance(amount, bool) or not isinstance(amount, int | str):
        raise SpecError("amount", amount, AMOUNT_ALLOWED)
    text = str(amount).strip()
    if text.startswith("-"):
        raise SpecError("amount", amount, AMOUNT_ALLOWED)
    text = text.removeprefix("+").strip()
    try:
        seconds = parse_walltime(text, field="amount")
    except SpecError:
        raise SpecError("amount", amount, AMOUNT_ALLOWED) from None
    return max(1, math.ceil(seconds / 60))


def warning_due(status: Status, warning_seconds: int, now: float | None = None) -> bool:
    """The walltime warning applies now: the job's event said so (unless the walltime was
    extended since), or Slurm's time left is within ``warning_seconds``."""
    if status.state.is_final:
        return False
    left = status.walltime_left(now)
    if left is None:
        return status.walltime_warning
    if left <= warning_seconds:
        return True
    return status.walltime_warning and left <= warning_seconds + SIGNAL_SLACK


@dataclass(frozen=True)
class Extension:
    """A time limit raised: by how much, and what Slurm says now."""

    job_id: str
    minutes: int
    time_left: int | None
    time_limit: int | None


async def extend_walltime(slurm: Scheduler, job_id: str | None, amount: object) -> Extension:
    """Add ``amount`` to the job's time limit, then ask Slurm for the new time left."""
    minutes = parse_extension(amount)
    if not job_id:
        raise SlurmRayError("the cluster has no Slurm job to extend")
    try:
        await slurm.extend(job_id, minutes)
    except ExtendRefused as exc:
        raise ExtendRefused(refusal_advice(job_id, minutes, str(exc))) from None
    info = (await slurm.query([job_id])).get(job_id)
    return Extension(
        job_id, minutes, info.time_left if info else None, info.time_limit if info else None
    )


def refusal_advice(job_id: str, minutes: int, words: str) -> str:
    """Slurm's refusal, then what to do."""
    said = words.removeprefix("scontrol failed: ").rstrip(".")
    what = f"Slurm refused to extend job {job_id} by {minutes} min: {said}."
    if "permission denied" in words.lower() or "access" in words.lower():
        return (
            f"{what} On this site users may not raise their own time limit: ask an operator "
            f"or your site's support to extend job {job_id} (scontrol update JobId={job_id} "
            f"TimeLimit=+{minutes}), or save your work and start a new cluster with a longer "
            "walltime (-t)."
        )
    return (
        f"{what} The new limit may be beyond what the partition or QOS allows "
        "(MaxTime, MaxWall): ask for less, or start a new cluster with a longer walltime (-t)."
    )
