"""Slurm's answers, parsed: JobInfo from squeue / sacct / scontrol, Partition from sinfo,
Association and Qos from sacctmgr, UsageRow from sacct (its units: ``formats.py``). Pure
functions, no commands run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from ..scheduler.records import (
    Association,
    JobInfo,
    Partition,
    Qos,
    UsageRow,
)
from ..spec.units import parse_duration, parse_size
from .formats import (
    expand_hostlist,
    parse_cpu_time,
    parse_exit_code,
    parse_timestamp,
    parse_tres,
)

log = logging.getLogger(__name__)

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
        source="squeue",
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


def _leading_int(text: str) -> int:
    match = re.match(r"\d+", text)
    return int(match.group()) if match else 0


def _gpus_in(gres: Sequence[str]) -> int:
    for item in gres:
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item)
        if match:
            return int(match.group(1))
    return 0
