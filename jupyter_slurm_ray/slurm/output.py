"""Slurm's output formats, parsed: JobInfo from squeue / sacct / scontrol, Partition from
sinfo, Association and Qos from sacctmgr, UsageRow from sacct, durations, CPU times, sizes,
TRES lists, timestamps, exit codes and host lists. Pure functions, no commands run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction

log = logging.getLogger(__name__)

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

SQUEUE_FIELDS = ("%i", "%T", "%D", "%S", "%L", "%l", "%N", "%j", "%k", "%r")
SQUEUE_FORMAT = "|".join(SQUEUE_FIELDS)
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Start,Timelimit,JobName"
#: sinfo's partition lines; ``%s`` (the job size range in nodes, e.g. ``1-2``) gives MaxNodes.
SINFO_FORMAT = "%R|%a|%F|%c|%m|%G|%l|%P|%s"
#: ``sacctmgr show user withassoc``: the user's default account and one line per association.
ASSOCIATION_FIELDS = (
    "User,DefaultAccount,Account,Partition,QOS,DefaultQOS,MaxWall,MaxTRES,MaxTRESPerNode,AdminLevel"
)
QOS_FIELDS = "Name,MaxWall,MaxTRESPerJob,MaxTRESPerNode,MinTRESPerJob,Flags"
#: ``sacct --noconvert`` (sizes in bytes): allocations and their steps, for what a job used.
USAGE_FIELDS = "JobID,State,ElapsedRaw,AllocTRES,AllocCPUS,TotalCPU,MaxRSS,MaxRSSNode,NodeList"


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job at one moment."""

    job_id: str
    state: str
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    start_time: datetime | None = None  # actual, or Slurm's estimate while PENDING
    time_left: int | None = None  # seconds; None when unknown or unlimited
    time_limit: int | None = None
    name: str = ""
    exit_code: int | None = None
    source: str = "squeue"
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
    max_nodes: int | None = None  # Slurm's MaxNodes (per job); None = unlimited or unknown


@dataclass(frozen=True)
class Association:
    """One association of a user with an account (``sacctmgr show user withassoc``): the QOSes
    it may use and the per-job limits set on it."""

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
    """One QOS (``sacctmgr show qos``) and its per-job limits."""

    name: str
    max_wall: int | None = None  # seconds (MaxWall)
    max_tres_per_job: dict[str, str] = field(default_factory=dict)
    max_tres_per_node: dict[str, str] = field(default_factory=dict)
    min_tres_per_job: dict[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class UsageRow:
    """One line of ``sacct`` for usage: a job's allocation (``step`` None) or one of its steps."""

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


def parse_squeue_line(line: str) -> JobInfo | None:
    parts = line.split("|", len(SQUEUE_FIELDS) - 1)
    if len(parts) != len(SQUEUE_FIELDS):
        log.warning("unexpected squeue line: %r", line)
        return None
    job_id, state, count, start, left, limit, nodelist, name, comment, reason = (
        p.strip() for p in parts
    )
    return JobInfo(
        job_id=job_id,
        state=state.split()[0] if state else "UNKNOWN",
        reason=None if reason in {"", "None", "(null)"} else reason,
        nodes=tuple(expand_hostlist(nodelist)),
        node_count=int(count) if count.isdigit() else 0,
        start_time=parse_timestamp(start),
        time_left=parse_duration(left),
        time_limit=parse_duration(limit),
        name=name,
        comment="" if comment == "(null)" else comment,
    )


def parse_sacct(out: str) -> dict[str, JobInfo]:
    infos: dict[str, JobInfo] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 7 or not parts[0].split(".")[0].isdigit() or "." in parts[0]:
            continue
        job_id, state, exit_code, nodelist, start, limit, name = parts[:7]
        infos[job_id] = JobInfo(
            job_id=job_id,
            state=state.split()[0] if state else "UNKNOWN",  # "CANCELLED by 1000"
            nodes=tuple(expand_hostlist(nodelist)),
            node_count=len(expand_hostlist(nodelist)),
            start_time=parse_timestamp(start),
            time_limit=parse_duration(limit),
            name=name,
            exit_code=parse_exit_code(exit_code),
            source="sacct",
        )
    return infos


def parse_scontrol_job(out: str) -> JobInfo | None:
    """One ``scontrol show job -o`` line (``Key=Value`` pairs) → JobInfo."""
    fields = dict(re.findall(r"(\w+)=(\S*)", out))
    if "JobId" not in fields:
        return None
    nodes = expand_hostlist(fields.get("NodeList", ""))
    return JobInfo(
        job_id=fields["JobId"],
        state=fields.get("JobState", "UNKNOWN"),
        nodes=tuple(nodes),
        node_count=len(nodes),
        start_time=parse_timestamp(fields.get("StartTime", "")),
        time_limit=parse_duration(fields.get("TimeLimit", "")),
        name=fields.get("JobName", ""),
        exit_code=parse_exit_code(fields.get("ExitCode", "")),
        source="scontrol",
    )


def merge_final(live: JobInfo | None, history: JobInfo | None) -> JobInfo | None:
    if live is None:
        return history
    if history is None:
        return live
    # squeue knows the nodes and limits best; accounting (or scontrol) knows the exit code.
    source = f"{live.source}+{history.source}"
    return JobInfo(**{**live.__dict__, "exit_code": history.exit_code, "source": source})


def parse_sinfo(out: str) -> list[Partition]:
    """Aggregate sinfo's per-(partition, node shape) lines into one entry per partition.

    Lines have the fields of :data:`SINFO_FORMAT`; the last one (``%s``) may be missing.
    """
    merged: dict[str, Partition] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 8:
            parts.append("")
        if len(parts) != 9:
            continue
        name, avail, counts, cpus, mem, gres, limit, pname, sizes = parts
        alloc_idle_other_total = [int(x) for x in counts.split("/") if x.isdigit()]
        if len(alloc_idle_other_total) != 4:
            continue
        _, idle, _, total = alloc_idle_other_total
        gres_items = tuple(g for g in gres.split(",") if g and g != "(null)")
        entry = Partition(
            name=name,
            available=avail == "up",
            idle_nodes=idle,
            total_nodes=total,
            cpus_per_node=_leading_int(cpus),
            memory_mb=_leading_int(mem),
            gres=gres_items,
            max_time=parse_duration(limit),
            is_default=pname.endswith("*"),
            gpus_per_node=_gpus_in(gres_items),
            max_nodes=_max_job_nodes(sizes),
        )
        previous = merged.get(name)
        if previous is not None:
            entry = Partition(
                **{
                    **entry.__dict__,
                    "idle_nodes": previous.idle_nodes + idle,
                    "total_nodes": previous.total_nodes + total,
                    "cpus_per_node": min(previous.cpus_per_node, entry.cpus_per_node),
                    "memory_mb": min(previous.memory_mb, entry.memory_mb),
                    "gres": tuple(dict.fromkeys(previous.gres + entry.gres)),
                }
            )
        merged[name] = entry
    return list(merged.values())


def _max_job_nodes(sizes: str) -> int | None:
    """sinfo's ``%s``: ``1-2`` → 2; ``1-infinite`` (or nothing) → None."""
    high = sizes.strip().rpartition("-")[2]
    return int(high) if high.isdigit() else None


# -- accounting (sacctmgr) ---------------------------------------------------------------------
def parse_associations(out: str) -> list[Association]:
    """``sacctmgr -n -P show user withassoc format=`` :data:`ASSOCIATION_FIELDS` lines."""
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != len(ASSOCIATION_FIELDS.split(",")) or not parts[2]:
            continue  # a user without associations has one line with no account
        user, default_account, account, partition, qos, default_qos, wall, tres, per_node, admin = (
            parts
        )
        found.append(
            Association(
                user=user,
                account=account,
                default_account=default_account or None,
                partition=partition or None,
                qos=tuple(q for q in qos.split(",") if q),
                default_qos=default_qos or None,
                max_wall=parse_duration(wall) if wall else None,
                max_tres=parse_tres(tres),
                max_tres_per_node=parse_tres(per_node),
                admin_level=admin or "None",
            )
        )
    return found


def parse_qos(out: str) -> dict[str, Qos]:
    """``sacctmgr -n -P show qos format=`` :data:`QOS_FIELDS` lines, by QOS name."""
    found = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != len(QOS_FIELDS.split(",")) or not parts[0]:
            continue
        name, wall, per_job, per_node, min_per_job, flags = parts
        found[name] = Qos(
            name=name,
            max_wall=parse_duration(wall) if wall else None,
            max_tres_per_job=parse_tres(per_job),
            max_tres_per_node=parse_tres(per_node),
            min_tres_per_job=parse_tres(min_per_job),
            flags=tuple(f for f in flags.split(",") if f),
        )
    return found


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=4,gres/gpu=2,mem=16G,node=1`` → ``{"cpu": "4", "gres/gpu": "2", …}``."""
    pairs = (item.partition("=") for item in text.split(",") if "=" in item)
    return {name.strip(): value.strip() for name, _, value in pairs if name.strip()}


def tres_amount(name: str, value: str) -> int | None:
    """A TRES count as a number: memory in megabytes (``16G`` → 16384), others as they are."""
    if name == "mem":
        size = parse_size(value, unit="M")
        return None if size is None else size // 1024**2
    match = re.fullmatch(r"\d+", value.strip())
    return int(match.group()) if match else None


# -- usage (sacct) -----------------------------------------------------------------------------
def parse_usage(out: str) -> list[UsageRow]:
    """``sacct -n -P --noconvert -o`` :data:`USAGE_FIELDS` lines: allocations and steps."""
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != len(USAGE_FIELDS.split(",")):
            continue
        job_id, state, elapsed, tres, cpus, total_cpu, max_rss, rss_node, nodelist = parts
        allocation, _, step = job_id.partition(".")
        if not re.fullmatch(r"\d+(_\d+)?", allocation):
            continue  # heterogeneous job parts ("12+0") and anything unexpected
        rows.append(
            UsageRow(
                job_id=job_id,
                allocation=allocation,
                step=step or None,
                state=state.split()[0] if state else "UNKNOWN",
                elapsed=int(elapsed) if elapsed.isdigit() else 0,
                alloc_tres=parse_tres(tres),
                alloc_cpus=int(cpus) if cpus.isdigit() else 0,
                total_cpu=parse_cpu_time(total_cpu) or 0.0,
                max_rss=parse_size(max_rss, unit="B") if max_rss else None,
                max_rss_node=rss_node or None,
                nodes=tuple(expand_hostlist(nodelist)),
            )
        )
    return rows


_CPU_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def parse_cpu_time(text: str) -> float | None:
    """Seconds in sacct's CPU times: ``00:07.832`` (M:S.ms), ``01:02:03``, ``1-02:03:04``."""
    match = _CPU_TIME.match(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


# Slurm's sizes, as sbatch takes them and Slurm prints them: a number with a unit (powers of
# 1024, ``16G``, ``16GB``, ``16GiB``) or without (then in the caller's unit); a fraction needs
# its unit.
BYTES_PER_UNIT = {"B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(
    r"([0-9]{1,15}(?:\.[0-9]{1,9})?)(?:([KMGTP])(?:I?B)?)?", re.ASCII | re.IGNORECASE
)


def size_in_bytes(text: str, unit: str = "B") -> Fraction | None:
    """The exact bytes of a Slurm size (``unit``: that of a bare number, a key of
    BYTES_PER_UNIT); None when it is none."""
    match = _SIZE.fullmatch(text.strip())
    if not match or ("." in match.group(1) and not match.group(2)):
        return None
    number, suffix = match.groups()
    return Fraction(number) * BYTES_PER_UNIT[(suffix or unit).upper()]


def parse_size(text: str, *, unit: str = "B") -> int | None:
    """Bytes in a size as Slurm prints it: ``219426816`` (in ``unit``), ``214284K``, ``1.5G``."""
    size = size_in_bytes(text, unit)
    return None if size is None else int(size)


def _leading_int(text: str) -> int:
    match = re.match(r"\d+", text)
    return int(match.group()) if match else 0


def _gpus_in(gres: Sequence[str]) -> int:
    for item in gres:
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item)
        if match:
            return int(match.group(1))
    return 0


# Slurm's durations, as sbatch takes them and Slurm prints them: M, M:S, H:M:S, D-H, D-H:M,
# D-H:M:S (the leading field of any size, the others within their unit).
_LEAD = "([0-9]{1,9})"
_PART = "([0-9]{1,2})"
_DURATION_FORMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.ASCII), units)
    for pattern, units in (
        (_LEAD, "m"),
        (f"{_LEAD}:{_PART}", "ms"),
        (f"{_PART}:{_PART}:{_PART}", "hms"),
        (f"{_LEAD}-{_PART}", "dh"),
        (f"{_LEAD}-{_PART}:{_PART}", "dhm"),
        (f"{_LEAD}-{_PART}:{_PART}:{_PART}", "dhms"),
    )
)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_LIMIT = {"h": 24, "m": 60, "s": 60}


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, a bare number of
    minutes, ``D-H``, ``D-H:M``); None for anything else (UNLIMITED, NOT_SET, INVALID, N/A)."""
    text = text.strip()
    for pattern, units in _DURATION_FORMS:
        match = pattern.fullmatch(text)
        if match:
            return _sum_units(units, [int(group) for group in match.groups()])
    return None


def _sum_units(units: str, numbers: list[int]) -> int | None:
    total = 0
    for index, (unit, number) in enumerate(zip(units, numbers, strict=True)):
        bounded = index > 0 or unit == "h"
        if bounded and number >= _UNIT_LIMIT[unit]:
            return None
        total += number * _UNIT_SECONDS[unit]
    return total


def parse_timestamp(text: str) -> datetime | None:
    text = text.strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None  # N/A, Unknown, None


def parse_exit_code(text: str) -> int | None:
    """``"2:0"`` → 2; ``"0:15"`` (killed by signal 15) → 128 + 15."""
    code, _, sig = text.strip().partition(":")
    if not code.isdigit():
        return None
    if sig.isdigit() and int(sig) and not int(code):
        return 128 + int(sig)
    return int(code)


_HOST_RANGE = re.compile(r"\[([^\]]+)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``"node[1-3,7],gpu01"`` → ``["node1", "node2", "node3", "node7", "gpu01"]``.

    Written here rather than running ``scontrol show hostnames`` once per job on every poll.
    """
    hostlist = hostlist.strip()
    if not hostlist or hostlist in {"(null)", "None assigned", "N/A"}:
        return []
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [i for i in items if i]


def _expand_one(item: str) -> list[str]:
    match = _HOST_RANGE.search(item)
    if not match:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    expanded = []
    for part in match.group(1).split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            names = [lo]
        else:
            width = len(lo)
            names = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        for name in names:
            expanded.extend(_expand_one(prefix + name + suffix))
    return expanded
