"""What any scheduler says of its jobs and its site, whatever the batch system: a job's state
at one moment (``JobInfo``), a partition, an association and a QOS with their per-job limits,
and a line of what a job used (``UsageRow``). Data only; each scheduler makes them from its own
system's answers (Slurm's: ``slurm/output.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["FINAL_STATES", "Association", "JobInfo", "Partition", "Qos", "UsageRow"]


#: States after which a job never runs again.
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)


@dataclass(frozen=True)
class JobInfo:
    """What a scheduler says about one job at one moment."""

    job_id: str
    state: str
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    start_time: datetime | None = None  # actual, or the scheduler's estimate while PENDING
    time_left: int | None = None  # seconds; None when unknown or unlimited
    time_limit: int | None = None
    name: str = ""
    exit_code: int | None = None
    source: str = ""  # what answered (the scheduler's own word for it)
    comment: str = ""

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def is_running(self) -> bool:
        return self.state in {"RUNNING", "CONFIGURING", "COMPLETING"}


@dataclass(frozen=True)
class Partition:
    """One partition as the widget's dropdown shows it."""

    name: str
    available: bool
    idle_nodes: int
    total_nodes: int
    cpus_per_node: int
    memory_mb: int
    gres: tuple[str, ...] = ()
    max_time: int | None = None  # seconds; None = unlimited
    is_default: bool = False
    gpus_per_node: int = field(default=0)
    max_nodes: int | None = None  # most nodes per job; None = unlimited or unknown


@dataclass(frozen=True)
class Association:
    """One association of a user with an account: the QOSes it may use and the per-job limits
    set on it."""

    user: str
    account: str
    default_account: str | None = None
    partition: str | None = None  # None: every partition
    qos: tuple[str, ...] = ()  # empty: not shown (not checked)
    default_qos: str | None = None
    max_wall: int | None = None  # seconds (MaxWall)
    max_tres: dict[str, str] = field(default_factory=dict)  # per job (MaxTRES)
    max_tres_per_node: dict[str, str] = field(default_factory=dict)
    admin_level: str = "None"


@dataclass(frozen=True)
class Qos:
    """One QOS (quality of service) and its per-job limits."""

    name: str
    max_wall: int | None = None  # seconds (MaxWall)
    max_tres_per_job: dict[str, str] = field(default_factory=dict)
    max_tres_per_node: dict[str, str] = field(default_factory=dict)
    min_tres_per_job: dict[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class UsageRow:
    """What one job used: its allocation (``step`` None) or one of its steps."""

    job_id: str  # "25", "25.batch", "25.0"
    allocation: str  # "25"
    step: str | None
    state: str
    elapsed: int = 0  # seconds
    alloc_tres: dict[str, str] = field(default_factory=dict)
    alloc_cpus: int = 0
    total_cpu: float = 0.0  # seconds of CPU time used (user + system)
    max_rss: int | None = None  # bytes
    max_rss_node: str | None = None
    nodes: tuple[str, ...] = ()
