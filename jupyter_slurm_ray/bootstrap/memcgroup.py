"""This job's memory cgroup on the node, where the site enforces memory: its limit, and how many
processes the kernel killed for going over it (cgroup v1 and v2).

Slurm's task/cgroup puts each job in ``…/job_<id>/step_<step>/…`` with the job's memory limit.
When Ray's processes go over it, the kernel kills one of them (the raylet, the GCS, a worker):
Ray then prints a traceback about a timeout, not a word about memory. The bootstrap reads the
count of kills before it starts Ray and again when Ray ends, and says "out of memory" with the
limit when it rose.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

UNLIMITED = 2**60  # v1 prints a page-rounded LONG_MAX for "no limit"
LEVELS = 4  # the step's cgroup and its parents that may hold the job's limit


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup of this process and its parents (the job's limit is one of them)."""

    chain: tuple[Path, ...]  # this process's cgroup first
    v2: bool

    def limit_mb(self) -> int | None:
        """The tightest limit on the chain (MiB), None when none is set."""
        limits = [value for path in self.chain if (value := self._limit(path)) is not None]
        return min(limits) // 2**20 if limits else None

    def oom_kills(self) -> int:
        """How many processes the kernel killed for a limit on the chain (the most any level
        counted: a kill is counted where the limit was hit)."""
        return max((self._kills(path) for path in self.chain), default=0)

    def _limit(self, path: Path) -> int | None:
        text = read(path / ("memory.max" if self.v2 else "memory.limit_in_bytes"))
        if text is None or not text.isdigit() or int(text) >= UNLIMITED:
            return None
        return int(text)

    def _kills(self, path: Path) -> int:
        text = read(path / ("memory.events" if self.v2 else "memory.oom_control")) or ""
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0


def read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return None


def own_memory_cgroup(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> MemoryCgroup | None:
    """This process's memory cgroup, as ``/proc/self/cgroup`` names it (None without one)."""
    text = read(proc_cgroup) or ""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if "memory" in controllers.split(","):
            return MemoryCgroup(chain(root / "memory", path), v2=False)
    for line in text.splitlines():
        if line.startswith("0::"):
            return MemoryCgroup(chain(root, line[3:]), v2=True)
    return None


def chain(mount: Path, path: str) -> tuple[Path, ...]:
    """The cgroup's directory and its parents, LEVELS at most, below the mount."""
    parts = [part for part in path.strip("/").split("/") if part]
    found = []
    for depth in range(len(parts), max(0, len(parts) - LEVELS), -1):
        found.append(mount.joinpath(*parts[:depth]))
    return tuple(found)


@dataclass
class OomWatch:
    """The kills counted when the node started; ``since()``: the kills since, and the limit."""

    cgroup: MemoryCgroup | None
    at_start: int = 0

    @classmethod
    def start(cls) -> OomWatch:
        cgroup = own_memory_cgroup()
        return cls(cgroup, cgroup.oom_kills() if cgroup else 0)

    def since(self) -> tuple[int, int | None]:
        if self.cgroup is None:
            return 0, None
        return self.cgroup.oom_kills() - self.at_start, self.cgroup.limit_mb()
