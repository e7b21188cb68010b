"""Consecutive free port blocks for one node: probed by binding, recorded as claims.

Three ways to choose a block (``port_strategy``): ``random`` (a random free block in
port_range), ``fixed`` (fixed_port_base) and ``hash_jobid`` (the block derived from the job id,
see ``derived_starts``: a site or a user can predict it; the next derived block when it is
taken). Only ports that others must reach or that Ray would otherwise take at a fixed
default are in a block (``jsr_wire.PORT_NAMES``); Ray's GCS and agents take kernel-assigned ports
(``rayargs.KERNEL_ASSIGNED``), which no one can take before Ray binds them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsr_base import BootstrapError, short_hostname
from jsr_wire import PORT_NAMES
from portlock import (
    LOCK_WAIT,
    MAX_BLOCK,
    Notify,
    live_claims,
    lock_dir_for,
    port_lock,
    write_claim,
)


@dataclass
class PendingClaim:
    """The exact claim, held back: in a lock dir other users can read, a claim of a random
    block would name its ports before Ray binds them. Until ``PortBlock.publish`` the claim
    covers a wider window around the block (others keep clear of it, nobody learns the
    block from it); fixed and hash_jobid blocks can be predicted anyway and are claimed
    exactly at once."""

    lock_dir: Path
    job: str
    notify: Notify


@dataclass
class PortBlock:
    """Consecutive ports claimed for one node: the named ports, then the worker port range."""

    start: int
    size: int
    claim_file: Path | None = None
    pending: PendingClaim | None = None

    @property
    def ports(self) -> dict[str, int]:
        named = {name: self.start + i for i, name in enumerate(PORT_NAMES)}
        if self.size > len(PORT_NAMES):
            named["min_worker"] = self.start + len(PORT_NAMES)
            named["max_worker"] = self.start + self.size - 1
        return named

    @property
    def ports_range(self) -> range:
        return range(self.start, self.start + self.size)

    def publish(self) -> None:
        """Claim exactly the block, in place of the window (see PendingClaim)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            window = self.claim_file
            self.claim_file = write_claim(
                pending.lock_dir, self.start, self.size, pending.job, pending.notify
            )
            if window is not None:
                with contextlib.suppress(OSError):
                    window.unlink()

    def release(self) -> None:
        self.pending = None
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


def derived_starts(
    job: str, size: int, port_range: tuple[int, int], taken: list[dict[str, Any]]
) -> list[int]:
    """hash_jobid: port_range cut into aligned slots of `size` ports from its low end; the
    job's slot is int(sha256(job id), 16) mod the number of slots, then the next slots in
    order (wrapping). Slots in the ephemeral range or in believed claims are left out."""
    low, high = port_range
    slots = (high - low + 1) // size
    if slots <= 0:
        return []
    first = int(hashlib.sha256(job.encode()).hexdigest(), 16) % slots
    usable = set(candidate_starts(port_range, size, taken))
    ordered = [low + ((first + i) % slots) * size for i in range(slots)]
    return [start for start in ordered if start in usable]


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


def first_free(starts: list[int], size: int, attempts: int) -> int | None:
    return next((s for s in starts[:attempts] if first_busy_port(s, size) is None), None)


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
    for believed in believed_claims(taken):
        starts = candidate_starts(port_range, size, believed)
        start = first_free(rng.sample(starts, min(attempts, len(starts))), size, attempts)
        if start is not None:
            return start
    return None


def derived_block_start(
    job: str, size: int, port_range: tuple[int, int], taken: list[dict[str, Any]], attempts: int
) -> int | None:
    """hash_jobid: the first derived block whose ports all bind (claims believed as above)."""
    for believed in believed_claims(taken):
        start = first_free(derived_starts(job, size, port_range, believed), size, attempts)
        if start is not None:
            return start
    return None


def believed_claims(taken: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every claim first; then, if others' claims left nothing, this user's only."""
    mine = [claim for claim in taken if claim["uid"] == os.getuid()]
    return [taken, mine] if len(mine) < len(taken) else [taken]


def claim_window(
    start: int, size: int, port_range: tuple[int, int], rng: random.Random
) -> tuple[int, int]:
    """(start, size) of a window around the block, its position in it random, within
    port_range: three blocks' worth of ports more (fewer when that would be implausible)."""
    spare = min(3 * size, MAX_BLOCK - size)
    before = rng.randint(0, spare)
    low = max(port_range[0], start - before)
    high = min(port_range[1], start + size - 1 + spare - before)
    return low, high - low + 1


def others_can_read(directory: Path | None) -> bool:
    """A lock dir where another user could read claims (a site's shared one, a configured one)."""
    if directory is None:
        return False
    try:
        info = os.stat(directory)
    except OSError:
        return True
    return info.st_uid != os.getuid() or bool(stat.S_IMODE(info.st_mode) & 0o055)


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
    In a lock dir other users can read, the claim waits for ``PortBlock.publish``.
    """
    say = notify or (lambda _reason: None)
    rng = rng or random.Random()
    directory = lock_dir_for(lock_dir, say)
    with port_lock(directory, say, lock_wait):
        taken = live_claims(directory)
        taken += [{"start": s, "size": n, "uid": os.getuid(), "job_id": job} for s, n in avoid]
        if strategy == "fixed":
            assert fixed_base is not None
            check_fixed_block(fixed_base, size, taken)
            start: int | None = fixed_base
        elif strategy == "hash_jobid":
            start = derived_block_start(job, size, port_range, taken, attempts)
        else:
            start = free_block_start(size, port_range, taken, attempts, rng)
        if start is not None and strategy == "random" and others_can_read(directory):
            low, wide = claim_window(start, size, port_range, rng)
            window = write_claim(directory, low, wide, job, say)
            return PortBlock(start, size, window, PendingClaim(directory, job, say))
        if start is not None:
            return PortBlock(start, size, write_claim(directory, start, size, job, say))
    low, high = port_range
    which = "derived block" if strategy == "hash_jobid" else "free block"
    raise BootstrapError(
        f"no {which} of {size} consecutive ports in {low}-{high} on {short_hostname()} "
        f"(outside the ephemeral range {ephemeral_port_range()}, after {attempts} attempts)"
    )
