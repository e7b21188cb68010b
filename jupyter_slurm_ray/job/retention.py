"""What ended clusters leave on disk, pruned once ``record_retention_days`` have passed: their
job dirs, the environment packs no job dir names any more, and this machine's cached packs
(``jupyter slurm-ray gc``; ``--dry-run`` shows what would go and the space it frees).

Only what is provably this user's and provably ended goes. A job dir (a real directory named
by a cluster id, owned by this user, under a job dir root that passes the trust check) goes
when its cluster's record is final and, like the dir's newest file, older than the retention;
or, without a record, when Slurm shows no active job of it (neither by its tag nor by the job
ids of its output files) and nothing in it changed for the retention. A dir that a record of
a live cluster names, or of which Slurm shows an active job, always stays. A pack goes when
no job dir that stays names it and it is older than the retention; a cached pack here the same.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..bootstrap.jsr_wire import PACK_VARIABLE
from ..errors import SlurmRayError
from ..naming import is_cluster_id
from ..registry import ClusterRecord
from ..scheduler.interface import Scheduler
from ..scheduler.kinds import DEFAULT_MODE, kind_for_mode, kind_of
from ..slurm.schedulers import operating
from ..transport import Transport
from .packs import PACKS_DIR

__all__ = ["Pruning", "Removal", "apply", "plan"]

DAY = 86400.0
_PACK_NAME = re.compile(r"\.?env-(venv|conda|pixi)-[0-9a-f]{16}[A-Za-z0-9._-]*")

# Constant program (``sh -c LIST sh ROOT``): this user's uid, then one tab-separated line per
# real directory of ROOT (name, owner, newest mtime of it and its entries, KiB, the pack its
# job.sbatch names, the job ids of its slurm-<id>.out files) and per file of ROOT/packs.
# One `find` over the tree and one awk: a few processes per directory took ~14 ms each, 15 s
# for a thousand job dirs (the testbed's after a day of runs).
_LIST = r"""
echo "uid $(id -u)"
cd -- "$1" 2>/dev/null || exit 0
find . -mindepth 1 -path ./packs -prune -o -printf '%y\t%U\t%T@\t%k\t%d\t%P\n' 2>/dev/null |
awk -F '\t' -v variable="__PACK__=" '
  NF != 6 { next }
  {
    top = $6; sub(/\/.*/, "", top); name = substr($6, length(top) + 2)
    if ($5 == 1) {
      if ($1 == "d" && top !~ /^\./) {
        owner[top] = $2; newest[top] = $3; kib[top] = $4; dirs[++n] = top
      }
      next
    }
    if (!(top in owner)) next
    kib[top] += $4
    if ($5 != 2) next
    if ($3 > newest[top]) newest[top] = $3
    if (name ~ /^slurm-.*\.out$/) ids[top] = ids[top] substr(name, 7, length(name) - 10) " "
    if (name == "job.sbatch" && $1 == "f") sbatch[top] = 1
  }
  END {
    for (i = 1; i <= n; i++) {
      d = dirs[i]; pack = ""
      if (d in sbatch) {
        file = d "/job.sbatch"
        while (pack == "" && (getline line < file) > 0)
          if (match(line, variable "[^ ]*")) {
            pack = substr(line, RSTART + length(variable), RLENGTH - length(variable))
            sub(/.*\//, "", pack)
          }
        close(file)
      }
      printf "dir\t%s\t%s\t%s\t%s\t%s\t%s\n", d, owner[d], newest[d], kib[d], pack, ids[d]
    }
  }'
for f in packs/env-* packs/.env-*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  printf 'pack\t%s\t%s\n' "${f#packs/}" "$(stat -c '%u %Y %s' -- "$f")"
done
exit 0
""".replace("__PACK__", PACK_VARIABLE)
# Constant program (``sh -c REMOVE sh ROOT RELATIVE...``): each path, if it is still no
# symbolic link and this user's, removed; the paths removed printed.
_REMOVE = r"""
uid=$(id -u); cd -- "$1" || exit 1; shift
for p in "$@"; do
  [ -L "$p" ] && continue
  [ "$(stat -c %u -- "$p" 2>/dev/null)" = "$uid" ] || continue
  rm -rf -- "$p" && printf '%s\n' "$p"
done
"""


@dataclass(frozen=True)
class JobDirSeen:
    name: str
    owner: int
    newest: float  # the latest mtime of the dir and its entries
    size: int  # bytes
    pack: str  # the archive's name its job.sbatch gives JSR_ENV_PACK ("" none)
    job_ids: tuple[str, ...]  # from its slurm-<id>.out files (head and worker jobs)


@dataclass(frozen=True)
class PackSeen:
    name: str
    owner: int
    mtime: float
    size: int


@dataclass(frozen=True)
class Listing:
    root: str
    uid: int
    dirs: tuple[JobDirSeen, ...]
    packs: tuple[PackSeen, ...]


@dataclass(frozen=True)
class Activity:
    """What the schedulers said of a root's jobs: the active job ids among those asked, the
    cluster ids with an active tagged job (None: Slurm could not be asked), and the kinds of
    scheduler (their modes) that answered."""

    job_ids: frozenset[str] = frozenset()
    clusters: frozenset[str] | None = None
    answered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Removal:
    root: str  # "" for this machine's cache
    name: str  # relative to root (absolute for the cache)
    what: str  # "job dir", "pack", "cached pack"
    size: int
    why: str

    @property
    def path(self) -> str:
        return f"{self.root.rstrip('/')}/{self.name}" if self.root else self.name


@dataclass
class Pruning:
    """What would go (and what stays, and why), per root."""

    removals: list[Removal] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # roots that could not be looked at
    transports: dict[str, Transport] = field(default_factory=dict)  # root -> where it is

    @property
    def size(self) -> int:
        return sum(r.size for r in self.removals)


# ----------------------------------------------------------------------------- pure decisions


def parse_listing(root: str, text: str) -> Listing:
    """_LIST's output (lines it cannot read are skipped)."""
    uid, dirs, packs = -1, [], []
    for line in text.splitlines():
        fields = line.split("\t")
        with contextlib.suppress(ValueError, IndexError):
            if line.startswith("uid "):
                uid = int(line.split()[1])
            elif fields[0] == "dir" and len(fields) == 7:
                name, owner, newest, kib, pack, ids = fields[1:]
                dirs.append(
                    JobDirSeen(
                        name, int(owner), float(newest), int(kib) * 1024, pack, tuple(ids.split())
                    )
                )
            elif fields[0] == "pack" and len(fields) == 3:
                owner, mtime, size = fields[2].split()
                packs.append(PackSeen(fields[1], int(owner), float(mtime), int(size)))
    return Listing(root, uid, tuple(dirs), tuple(packs))


def ended_job_dirs(
    listing: Listing,
    records: Iterable[ClusterRecord],
    activity: Activity,
    *,
    now: float,
    retention: float,
    only: set[str] | None = None,
    spared: Mapping[str, str] | None = None,
) -> tuple[list[Removal], list[str], set[str]]:
    """The job dirs to remove, a line per dir that stays (and why), and the packs that the
    dirs that stay name. ``spared``: clusters whose dir stays whatever else is known, with
    why (their job was cancelled just now, their record cannot be read)."""
    by_id = {r.id: r for r in records}
    removals, kept, packs_named = [], [], set()
    for seen in listing.dirs:
        if not is_cluster_id(seen.name) or seen.owner != listing.uid:
            continue  # not a job dir, or not this user's
        if only is not None and seen.name not in only:
            packs_named.add(seen.pack)
            continue
        why_ended, why_kept = _judge(seen, by_id.get(seen.name), activity, now, retention)
        if spared and seen.name in spared:
            why_ended, why_kept = None, spared[seen.name]
        path = f"{listing.root}/{seen.name}"
        if why_ended is None:
            kept.append(f"kept job dir {path}: {why_kept}")
            packs_named.add(seen.pack)
        else:
            removals.append(Removal(listing.root, seen.name, "job dir", seen.size, why_ended))
    return removals, kept, packs_named - {""}


def _judge(
    seen: JobDirSeen,
    record: ClusterRecord | None,
    activity: Activity,
    now: float,
    retention: float,
) -> tuple[str | None, str]:
    """(why it ended and may go, None) or (None, why it stays)."""
    if record is not None and not record.is_final:
        return None, f"its cluster is {record.state} (record)"
    active = [j for j in seen.job_ids if j in activity.job_ids]
    if active or (activity.clusters is not None and seen.name in activity.clusters):
        return None, f"Slurm shows an active job of it ({', '.join(active) or 'by its tag'})"
    idle = now - max(seen.newest, record.updated_at if record is not None else 0.0)
    if idle <= retention:
        return None, f"ended or untouched for {_days(idle)} only"
    if record is not None:
        return f"{record.state} {_days(idle)} ago, by its record", ""
    unanswered = {kind_of(j).mode for j in seen.job_ids} - activity.answered
    if unanswered or (not seen.job_ids and activity.clusters is None):
        return None, "no record, and Slurm could not be asked whether it still runs"
    return f"no record; Slurm shows no active job of it; untouched for {_days(idle)}", ""


def unused_packs(
    listing: Listing, named: set[str], *, now: float, retention: float
) -> list[Removal]:
    """The packs of a root that no job dir that stays names, older than the retention."""
    return [
        Removal(listing.root, f"{PACKS_DIR}/{pack.name}", "pack", pack.size, why)
        for pack in listing.packs
        if (
            why := _pack_unused(
                pack.name, pack.owner == listing.uid, pack.mtime, named, now, retention
            )
        )
    ]


def cached_packs(
    directory: Path, named: set[str], *, now: float, retention: float
) -> list[Removal]:
    """This machine's cached packs (``packs.cache_dir()``) no job dir that stays names."""
    removals = []
    with contextlib.suppress(OSError):
        for path in sorted(directory.iterdir()):
            with contextlib.suppress(OSError):
                info = path.lstat()
                mine = info.st_uid == os.getuid() and path.is_file() and not path.is_symlink()
                why = _pack_unused(path.name, mine, info.st_mtime, named, now, retention)
                if why:
                    removals.append(Removal("", str(path), "cached pack", info.st_size, why))
    return removals


def _pack_unused(
    name: str, mine: bool, mtime: float, named: set[str], now: float, retention: float
) -> str:
    if not mine or not _PACK_NAME.fullmatch(name) or name in named:
        return ""
    age = now - mtime
    return f"no job dir names it, {_days(age)} old" if age > retention else ""


def _days(seconds: float) -> str:
    return f"{max(seconds, 0.0) / DAY:.1f} days"


# ----------------------------------------------------------------------------- asking, removing


async def list_root(transport: Transport, root: str) -> Listing:
    result = await transport.run(["sh", "-c", _LIST, "sh", root], timeout=300.0)
    listing = parse_listing(root, result.stdout)
    if listing.uid < 0:
        raise SlurmRayError(f"cannot list the job dir root {root}")
    return listing


async def activity(transport: Transport, listing: Listing) -> Activity:
    """Ask each kind of scheduler which of the listed jobs of its own are active, and Slurm
    which clusters have an active tagged job."""
    slurm = operating(kind_for_mode(DEFAULT_MODE))
    asked: dict[type[Scheduler], list[str]] = {slurm: []}  # Slurm's tags are asked anyway
    for job_id in sorted({j for d in listing.dirs for j in d.job_ids}):
        kind = operating(kind_of(job_id))
        if kind.owns(job_id):
            asked.setdefault(kind, []).append(job_id)
    active: set[str] = set()
    clusters: frozenset[str] | None = None
    answered: set[str] = set()
    for kind, job_ids in asked.items():
        scheduler = kind.create(transport)
        with contextlib.suppress(SlurmRayError):
            infos = await scheduler.query(job_ids)
            if kind is slurm:
                tagged = {**await scheduler.tagged_jobs(), **await scheduler.tagged_worker_jobs()}
                clusters = frozenset(tagged.values())
            active |= {j for j, info in infos.items() if not info.is_final}
            answered.add(kind.mode)
    return Activity(frozenset(active), clusters, frozenset(answered))


async def plan(
    places: Sequence[tuple[Transport, str]],
    records: Sequence[ClusterRecord],
    *,
    retention: float,
    cache_dir: Path | None,
    only: set[str] | None = None,
    spared: Mapping[str, str] | None = None,
    now: float | None = None,
) -> Pruning:
    """What gc would remove under each (transport, resolved job dir root), and in
    ``cache_dir`` (None: not looked at); ``only``: those clusters' job dirs alone;
    ``spared``: those clusters' job dirs stay, with why."""
    now = time.time() if now is None else now
    pruning, named = Pruning(), set()
    for transport, root in places:
        try:
            listing = await list_root(transport, root)
        except SlurmRayError as exc:
            pruning.skipped.append(f"skipped {root}: {exc}")
            continue
        pruning.transports[root] = transport
        said = await activity(transport, listing)
        removals, kept, in_use = ended_job_dirs(
            listing, records, said, now=now, retention=retention, only=only, spared=spared
        )
        pruning.removals += removals
        pruning.kept += kept
        named |= in_use
        if only is None:
            pruning.removals += unused_packs(listing, in_use, now=now, retention=retention)
    if cache_dir is not None and only is None:
        pruning.removals += cached_packs(cache_dir, named, now=now, retention=retention)
    return pruning


async def apply(pruning: Pruning) -> list[Removal]:
    """Remove what ``pruning`` lists (each path checked again: no symlink, this user's);
    the removals done."""
    done: list[Removal] = []
    for root, transport in pruning.transports.items():
        mine = [r for r in pruning.removals if r.root == root]
        if not mine:
            continue
        argv = ["sh", "-c", _REMOVE, "sh", root, *(r.name for r in mine)]
        result = await transport.run(argv, timeout=600.0, check=False)
        gone = set(result.stdout.splitlines())
        done += [r for r in mine if r.name in gone]
    for removal in (r for r in pruning.removals if not r.root):
        with contextlib.suppress(OSError):
            os.unlink(removal.name)
            done.append(removal)
    return done
