"""When the allocation a cluster runs in as steps (mode 'here') ends: the head's walltime
warning, which a job of its own gets from sbatch's ``--signal=B:USR1@<warning>``.

A step has no such signal that reaches the bootstrap alone (srun's ``--signal`` reaches every
process of the step, Ray's own included), so the head asks Slurm for the allocation's end
time, again every minute (it may be extended).
"""

from __future__ import annotations

import time
from datetime import datetime

from jsr_base import run_text
from slurmenv import own_job_environment

CHECK_EVERY = 60.0  # s between two questions to Slurm


def allocation_end(job: str) -> float | None:
    """The allocation's end (epoch), as ``squeue`` says it; None when unknown or unlimited."""
    argv = ["squeue", "-h", "-j", job, "-o", "%e"]
    text = run_text(argv, timeout=10, env=own_job_environment()).strip()
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class AllocationEnd:
    """The allocation ``job``'s end, watched for its walltime warning (``warning`` s before)."""

    def __init__(self, job: str, warning: float) -> None:
        self.job = job
        self.warning = warning
        self.end: float | None = None
        self.warned_for: float | None = None  # the end time a warning was given for
        self.next_check = 0.0

    def warning_due(self) -> bool:
        """True once per end time, when the allocation ends within the warning."""
        now = time.time()
        if now >= self.next_check:
            self.next_check = now + CHECK_EVERY
            self.end = allocation_end(self.job)
        if self.end is None or self.end == self.warned_for or now < self.end - self.warning:
            return False
        self.warned_for = self.end
        return True
