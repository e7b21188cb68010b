"""What ``%slurm_ray`` and ``jupyter slurm-ray`` both do, written once: list, down, logs,
forget, gc (orphaned jobs, then what ended clusters left on disk), extend, doctor. Each returns
the lines to print (doctor: its report); the callers only parse arguments and print."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import usecases
from ..aio import run_sync
from ..config import resolve_spec
from ..elastic.workerjobs import checked_node_count
from ..errors import SlurmRayError, SlurmUnavailable
from ..inventory import Entry, Orphan, find_orphans, kept_by_their_owners
from ..job import packs, retention
from ..job.directory import probe_site
from ..naming import is_cluster_id
from ..registry import ClusterRecord
from ..session import Session
from ..slurm.client import SlurmClient
from ..slurm.walltime import parse_extension
from ..transport import LocalTransport, Transport
from .formatting import extension_line, format_bytes, format_table, status_line

if TYPE_CHECKING:
    from ..doctor.checklist import Report

__all__ = [
    "doctor",
    "down",
    "extend",
    "forget",
    "gc",
    "list_table",
    "logs",
    "scale",
]

Confirm = Callable[[Orphan], bool]
ConfirmRemoval = Callable[[str], bool]  # the question: remove these N things (size)?


def list_table(session: Session, *, ended: bool = False) -> str:
    """The registry's clusters reconciled with Slurm, live ones first (ended ones past the
    retention are forgotten first; the others folded into a line unless ``ended``)."""
    days = float(session.setting("record_retention_days", 7.0))
    session.registry().prune(days * 86400)
    return format_table(run_sync(session.inventory().entries()), ended=ended)


def down(session: Session, name: str | None, *, everything: bool = False) -> list[str]:
    """Stop the cluster ``name`` (None: this kernel's current one), or every active one."""
    if everything and name:
        raise SlurmRayError("give a cluster NAME or --all, not both")
    if everything:
        entries = run_sync(session.inventory().entries())
        clusters = [session.find(e.id) for e in entries if e.active and not e.error]
        if not clusters:
            return ["no active clusters"]
    else:
        clusters = [session.find(name)]
    lines = []
    for cluster in clusters:
        cluster.down()
        lines.append(f"{cluster.spec.name} ({cluster.id}): {status_line(cluster.status)}")
    return lines


def scale(
    session: Session, name: str | None, nodes: str | int, group: str | None = None
) -> list[str]:
    """Scale the cluster ``name`` (None: this kernel's current one) to ``nodes`` Ray nodes in
    all (or, with a worker ``group``, to ``nodes`` worker jobs of it). Its owner scales it;
    any other process asks the owner (a ``scale_request`` event)."""
    count = checked_node_count(nodes, 0)  # a bad N is refused before anything is looked up
    cluster = session.find(name)
    of = f" of group {group}" if group else ""
    if not run_sync(usecases.scale(cluster, count, group)):
        return [
            f"{cluster.spec.name}: scaling to {count} nodes{of} asked of its owner (it applies it)"
        ]
    status = cluster.status
    pending = status.worker_jobs_pending
    waiting = f"; {len(pending)} worker job(s) pending" if pending else ""
    line = f"{cluster.spec.name}: {status.nodes_joined}/{status.nodes_wanted} nodes{waiting}"
    return [line + (f" (group {group}: {count} wanted)" if group else "")]


def extend(session: Session, name: str | None, amount: str) -> list[str]:
    """Add walltime to the cluster ``name`` (None: this kernel's current one); ExtendRefused
    carries the scheduler's words and what to do."""
    parse_extension(amount)  # a bad amount is refused before anything is looked up
    cluster = session.find(name)
    done = run_sync(usecases.extend(cluster, amount))
    return [extension_line(cluster.spec.name, done.minutes, done.time_left, done.time_limit)]


def logs(session: Session, name: str | None, *, node: str | None, tail: int) -> str:
    if not 0 < tail <= 100_000:
        raise SlurmRayError(f"--tail: {tail} is not a number of lines from 1 to 100000")
    cluster = session.find(name)
    text = cluster.logs(node=node, tail=tail)
    return text or f"no output yet for {cluster.spec.name} (job {cluster.job_id})"


def forget(session: Session, name: str | None, *, ended: bool = False) -> list[str]:
    """Delete the record of an ended cluster (its job dir, with the logs, stays), or of every
    ended cluster; an unreadable record can be forgotten by its id."""
    if bool(name) == bool(ended):
        raise SlurmRayError("give a cluster NAME or --ended")
    entries = run_sync(session.inventory().entries())
    if ended:
        chosen = [e for e in entries if e.record is not None and e.status.state.is_final]
        if not chosen:
            return ["no ended clusters"]
    else:
        chosen = [_entry_named(entries, name or "")]
    forgotten = usecases.forget(session.registry(), chosen)
    return [
        f"forgot {f.id} ({'unreadable record' if f.unreadable else f.state})" for f in forgotten
    ]


def _entry_named(entries: list[Entry], name: str) -> Entry:
    matches = [
        e
        for e in entries
        if name == e.id or (e.record is not None and name in (e.record.name, e.record.job_id))
    ]
    if not matches:
        raise SlurmRayError(f"no cluster {name!r} in the registry")
    return matches[-1]


def gc(
    session: Session,
    jobs: list[str],
    confirm: Confirm,
    *,
    dry_run: bool = False,
    confirm_removal: ConfirmRemoval | None = None,
) -> list[str]:
    """Offer to cancel our tagged jobs that no live record owns (see ``find_orphans``) unless
    a live owner elsewhere renews their lease (``kept_by_their_owners``), then prune what
    ended clusters left on disk past ``record_retention_days`` (``job/retention.py``: job
    dirs, unused packs, cached packs), after ``confirm_removal``. ``dry_run``: say what would
    be done and the space it would free; do nothing. ``jobs``: only these job or cluster ids
    (their job dirs; no packs)."""
    cancelled: set[str] = set()
    lines = _cancel_orphans(session, jobs, confirm, dry_run, cancelled)
    return [*lines, *_prune(session, jobs, dry_run, confirm_removal or _yes, cancelled)]


def _yes(question: str) -> bool:
    return True


def _cancel_orphans(
    session: Session, jobs: list[str], confirm: Confirm, dry_run: bool, cancelled: set[str]
) -> list[str]:
    """Orphaned jobs offered and cancelled (their cluster ids added to ``cancelled``)."""
    slurm = SlurmClient(session.transport())
    try:
        orphans = run_sync(find_orphans(slurm, session.registry()))
    except SlurmUnavailable as exc:
        return [f"orphaned jobs not looked for: Slurm did not answer ({exc})"]
    if jobs:
        wanted = set(jobs)
        orphans = [o for o in orphans if {o.job_id, o.cluster_id} & wanted]
    kept = run_sync(kept_by_their_owners(slurm, orphans))
    lines = [
        f"job {o.job_id} (cluster {o.cluster_id}): {o.why} here, but "
        f"{kept[o.job_id].owner.describe()} keeps its lease (renewed "
        f"{kept[o.job_id].age() or 0:.0f} s ago): left to its owner"
        for o in orphans
        if o.job_id in kept
    ]
    orphans = [o for o in orphans if o.job_id not in kept]
    if not orphans:
        return [*lines, "no orphaned jobs"]
    lines += [f"job {o.job_id} (cluster {o.cluster_id}): {o.why}" for o in orphans]
    if dry_run:
        return [*lines, f"would cancel {len(orphans)} job(s) (after asking, or with --yes)"]
    chosen = [o for o in orphans if confirm(o)]
    for orphan in chosen:
        run_sync(slurm.cancel(orphan.job_id))
        cancelled.add(orphan.cluster_id)
        lines.append(f"cancelled job {orphan.job_id}")
    if len(chosen) < len(orphans):
        lines.append(f"kept {len(orphans) - len(chosen)} job(s); --yes cancels without asking")
    return lines


def _prune(
    session: Session,
    jobs: list[str],
    dry_run: bool,
    confirm_removal: ConfirmRemoval,
    cancelled: set[str],
) -> list[str]:
    """What ended clusters left on disk, past the retention: said, or (asked) removed."""
    days = float(session.setting("record_retention_days", 7.0))
    registry = session.registry()
    records, unreadable = registry.scan()
    spared = {u.id: f"its record cannot be read ({u.error})" for u in unreadable}
    spared |= dict.fromkeys(cancelled, "its job was cancelled just now")
    only = _clusters_named(jobs, records) if jobs else None
    places, lines = _places(session, records)
    pruning = run_sync(
        retention.plan(
            places,
            records,
            retention=days * retention.DAY,
            cache_dir=packs.cache_dir(),
            only=only,
            spared=spared,
        )
    )
    lines += pruning.skipped
    will = "would remove" if dry_run else "to remove"
    lines += [
        f"{will} {r.what} {r.path} ({r.why}): {format_bytes(r.size)}" for r in pruning.removals
    ]
    if dry_run:
        lines += pruning.kept
    if not pruning.removals:
        return [*lines, f"nothing on disk to prune (ended or unused for more than {days:g} days)"]
    if dry_run:
        return [*lines, f"would free {format_bytes(pruning.size)}"]
    question = (
        f"remove {len(pruning.removals)} job dir(s) and pack(s), {format_bytes(pruning.size)}?"
    )
    if not confirm_removal(question):
        return [*lines, "removed nothing; --yes removes without asking"]
    done = run_sync(retention.apply(pruning))
    forgotten = registry.prune(days * retention.DAY)
    return [
        *lines,
        f"freed {format_bytes(sum(r.size for r in done))}: removed {len(done)} of "
        f"{len(pruning.removals)}"
        + (f"; forgot {len(forgotten)} ended record(s)" if forgotten else ""),
    ]


def _clusters_named(jobs: list[str], records: list[ClusterRecord]) -> set[str]:
    wanted = set(jobs)
    return {r.id for r in records if r.job_id in wanted} | {j for j in wanted if is_cluster_id(j)}


def _places(
    session: Session, records: list[ClusterRecord]
) -> tuple[list[tuple[Transport, str]], list[str]]:
    """Where job dirs are: the configured job dir root and the roots of the records this
    process can reach, each resolved and trust-checked once per machine; lines for those
    skipped."""
    configured = session.transport()
    wanted = [(configured, resolve_spec({}, config=session.config)[0].job_dir_root)]
    wanted += [
        (session.transport(r.target), r.job_dir.rsplit("/", 1)[0])
        for r in records
        if session.transports.reaches(r.target)
    ]
    places, seen, skipped = [], set(), []
    for transport, root in wanted:
        try:
            resolved = run_sync(probe_site(transport, root)).job_dir_root
        except SlurmRayError as exc:
            skipped.append(f"skipped the job dir root {root}: {exc}")
            continue
        if (_machine(transport), resolved) not in seen:
            seen.add((_machine(transport), resolved))
            places.append((transport, resolved))
    return places, sorted(set(skipped))


def _machine(transport: Transport) -> object:
    """Which machine and user a transport's files are (a local-mode sibling shares them)."""
    if isinstance(transport, LocalTransport):
        return ("here", tuple(transport.command_prefix))
    return transport.target


def doctor(
    session: Session,
    arguments: dict[str, Any],
    *,
    profile: str | None = None,
    setup: list[str] | None = None,
    queue_timeout: float = 120.0,
) -> Report:
    """The checklist for the request these settings mean (as ``up`` would resolve them), with
    one short test job on a compute node (always cancelled)."""
    from ..doctor.checklist import (
        run_doctor,  # its checks are imported when asked for, not with the magics
    )

    spec, _ = resolve_spec(arguments, profile=profile, config=session.config)
    if setup:
        spec = spec.replace(setup=(*spec.setup, *setup))
    hosts = session.setting("driver_hosts", None)
    report = run_doctor(spec, session.transport(), queue_timeout=queue_timeout, driver_hosts=hosts)
    return run_sync(report)
