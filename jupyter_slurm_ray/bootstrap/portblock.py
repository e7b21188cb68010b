"""Node-wide claims of consecutive free port blocks, under a lock shared by all users."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import secrets
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsr_base import BootstrapError, short_hostname

PORT_NAMES = (
    "gcs",
    "node_manager",
    "object_manager",
    "client",
    "dashboard",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "runtime_env_agent",
    "metrics_export",
    "autoscaler_metrics",
    "dashboard_metrics",
)
DEFAULT_LOCK_DIR = "/tmp/jupyter-slurm-ray-ports"


@dataclass
class PortBlock:
    """Consecutive ports claimed for one node: the named ports, then the worker port range."""

    start: int
    size: int
    claim_file: Path | None = None

    @property
    def ports(self) -> dict[str, int]:
        named = {name: self.start + i for i, name in enumerate(PORT_NAMES)}
        if self.size > len(PORT_NAMES):
            named["min_worker"] = self.start + len(PORT_NAMES)
            named["max_worker"] = self.start + self.size - 1
        return named

    def release(self) -> None:
        if self.claim_file is not None:
            with contextlib.suppress(OSError):
                self.claim_file.unlink()
            self.claim_file = None


def port_name(offset: int) -> str:
    return PORT_NAMES[offset] if offset < len(PORT_NAMES) else "worker"


def ranges_overlap(start: int, size: int, other_start: int, other_size: int) -> bool:
    return start < other_start + other_size and other_start < start + size


def ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """True if a TCP listener could bind the port on every address (no SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def first_busy_port(start: int, size: int) -> int | None:
    return next((p for p in range(start, start + size) if not port_is_free(p)), None)


def process_start_time(pid: int) -> int | None:
    """Start time of a live (non-zombie) process in clock ticks, None if there is none."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if after_name[0] in ("Z", "X") else int(after_name[19])


def claim_is_live(claim: dict[str, Any]) -> bool:
    started = process_start_time(int(claim.get("pid", 0)))
    return started is not None and claim.get("pid_start") in (None, started)


def ensure_shared_dir(path: Path) -> None:
    """A directory every user can create files in, like /tmp (mode 1777 regardless of umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o1777)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise BootstrapError(f"the port lock dir {path} is not a directory")
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o1777:
        os.chmod(path, 0o1777)


@contextlib.contextmanager
def port_lock(lock_dir: Path, timeout: float = 30.0) -> Iterator[None]:
    """Exclusive flock on lock_dir/lock, shared by all users of the node."""
    ensure_shared_dir(lock_dir)
    fd = os.open(lock_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BootstrapError(f"the port lock {lock_dir}/lock stayed busy") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def live_claims(lock_dir: Path) -> list[dict[str, Any]]:
    """Claims of live processes; stale claim files are removed where permitted."""
    claims = []
    for path in lock_dir.glob("*.claim"):
        try:
            claim = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if claim_is_live(claim):
            claims.append(claim)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return claims


def write_claim(lock_dir: Path, start: int, size: int, job: str) -> PortBlock:
    pid = os.getpid()
    claim = {"start": start, "size": size, "job_id": job, "pid": pid, "host": short_hostname()}
    claim.update(pid_start=process_start_time(pid), uid=os.getuid(), t=time.time())
    path = lock_dir / f"{start}-{pid}-{secrets.token_hex(3)}.claim"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        json.dump(claim, handle)
    return PortBlock(start, size, path)


def candidate_starts(
    port_range: tuple[int, int], size: int, taken: list[dict[str, Any]]
) -> list[int]:
    """Block starts in port_range that avoid the ephemeral range and every live claim."""
    low, high = port_range
    eph_low, eph_high = ephemeral_port_range()
    blocked = [(eph_low, eph_high - eph_low + 1)] + [(c["start"], c["size"]) for c in taken]
    return [
        start
        for start in range(low, high - size + 2)
        if not any(ranges_overlap(start, size, s, n) for s, n in blocked)
    ]


def check_fixed_block(start: int, size: int, taken: list[dict[str, Any]]) -> None:
    for claim in taken:
        if ranges_overlap(start, size, claim["start"], claim["size"]):
            raise BootstrapError(
                f"ports {start}-{start + size - 1} overlap ports claimed by job "
                f"{claim.get('job_id')} (pid {claim.get('pid')}) on {claim.get('host')}"
            )
    busy = first_busy_port(start, size)
    if busy is not None:
        raise BootstrapError(
            f"port {busy} ({port_name(busy - start)}) is already in use on {short_hostname()}; "
            f"choose another fixed_port_base than {start} or use port_strategy random"
        )


def claim_port_block(
    size: int,
    *,
    strategy: str,
    port_range: tuple[int, int],
    fixed_base: int | None,
    lock_dir: Path,
    job: str,
    attempts: int = 64,
    rng: random.Random | None = None,
) -> PortBlock:
    """Claim `size` consecutive free ports under the node-wide lock; release() removes the claim."""
    with port_lock(lock_dir):
        taken = live_claims(lock_dir)
        if strategy == "fixed":
            assert fixed_base is not None
            check_fixed_block(fixed_base, size, taken)
            return write_claim(lock_dir, fixed_base, size, job)
        starts = candidate_starts(port_range, size, taken)
        for start in (rng or random.Random()).sample(starts, min(attempts, len(starts))):
            if first_busy_port(start, size) is None:
                return write_claim(lock_dir, start, size, job)
    low, high = port_range
    raise BootstrapError(
        f"no free block of {size} consecutive ports in {low}-{high} on {short_hostname()} "
        f"(outside the ephemeral range {ephemeral_port_range()}, after {attempts} attempts)"
    )
