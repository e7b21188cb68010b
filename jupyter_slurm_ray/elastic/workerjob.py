"""One worker job of a cluster as this process knows it, as kept in the cluster's record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..spec.groups import DEFAULT_GROUP
from ..states import WORKER_ENDED, WorkerJobStatus


@dataclass
class WorkerJob:
    """One worker job as this process knows it (kept in the cluster's record)."""

    job_id: str
    state: str = "PENDING"  # Slurm's word, "ENDED" once Slurm forgot it
    reason: str | None = None  # Slurm's pending reason, or why it ended
    host: str | None = None
    joined: bool = False
    leaving: bool = False  # asked to drain, or leaving by itself
    submitted_at: float = 0.0
    estimated_start: str | None = None  # Slurm's estimate (squeue %S) while PENDING
    group: str = DEFAULT_GROUP  # its worker group (spec/groups.py)
    ends_at: float | None = None  # when its walltime ends (time.time()), once it runs
    replaced_by: str | None = None  # its replacement's job id (elastic/rotation.py)

    @property
    def pending(self) -> bool:
        """Still in Slurm's queue."""
        return self.state == "PENDING"

    @property
    def ended(self) -> bool:
        """Slurm says it ended (any end), or no longer knows it."""
        return self.state in WORKER_ENDED

    def view(self) -> WorkerJobStatus:
        return WorkerJobStatus(
            self.job_id,
            self.state,
            self.reason,
            self.host,
            self.joined,
            self.estimated_start,
            group=self.group,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerJob | None:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        job_id = values.get("job_id")
        if not isinstance(job_id, str) or not job_id.isdigit():
            return None
        return cls(**values)


def worker_minutes(time_left: int | None, at: float, now: float) -> int | None:
    """A worker job's walltime: the head's time left now, in whole minutes (at least 1), so
    that it never outlives the head and Slurm can backfill it before jobs that wait for the
    head's nodes; None when unknown or unlimited (the spec's walltime then)."""
    if time_left is None:
        return None
    return max(1, int((time_left - max(0.0, now - at)) // 60))
