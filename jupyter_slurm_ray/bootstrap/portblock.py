"""Consecutive free port blocks for one node: probed by binding, recorded as claims."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsr_base import BootstrapError, short_hostname
from portlock import LOCK_WAIT, Notify, live_claims, lock_dir_for, port_lock, write_claim

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
    """This user's claims and the bind probe decide (any user can write a claim file)."""
    for claim in taken:
        if claim["uid"] != os.getuid():
            continue
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


def free_block_start(
    size: int,
    port_range: tuple[int, int],
    taken: list[dict[str, Any]],
    attempts: int,
    rng: random.Random,
) -> int | None:
    """A random block start whose ports all bind; other users' claims are ignored if needed.

    Their claims are believed first; when they leave no free block (a hostile user can
    write a claim as easily as a real one), only this user's claims and the probe decide.
    """
    mine = [claim for claim in taken if claim["uid"] == os.getuid()]
    for believed in (taken, mine) if len(mine) < len(taken) else (taken,):
        starts = candidate_starts(port_range, size, believed)
        for start in rng.sample(starts, min(attempts, len(starts))):
            if first_busy_port(start, size) is None:
                return start
    return None


def claim_port_block(
    size: int,
    *,
    strategy: str,
    port_range: tuple[int, int],
    fixed_base: int | None,
    lock_dir: str | Path | None,
    job: str,
    notify: Notify | None = None,
    avoid: tuple[tuple[int, int], ...] = (),
    lock_wait: float = LOCK_WAIT,
    attempts: int = 64,
    rng: random.Random | None = None,
) -> PortBlock:
    """Claim `size` consecutive free ports on this node; release() removes the claim.

    lock_dir: the configured one, or None for automatic (see portlock.lock_dir_for).
    notify(reason) is told when the lock or the claims cannot be used (never fatal).
    avoid: (start, size) of blocks given up before, treated as claimed.
    """
    say = notify or (lambda _reason: None)
    directory = lock_dir_for(lock_dir, say)
    with port_lock(directory, say, lock_wait):
        taken = live_claims(directory)
        taken += [{"start": s, "size": n, "uid": os.getuid(), "job_id": job} for s, n in avoid]
        if strategy == "fixed":
            assert fixed_base is not None
            check_fixed_block(fixed_base, size, taken)
            start: int | None = fixed_base
        else:
            start = free_block_start(size, port_range, taken, attempts, rng or random.Random())
        if start is not None:
            return PortBlock(start, size, write_claim(directory, start, size, job, say))
    low, high = port_range
    raise BootstrapError(
        f"no free block of {size} consecutive ports in {low}-{high} on {short_hostname()} "
        f"(outside the ephemeral range {ephemeral_port_range()}, after {attempts} attempts)"
    )
