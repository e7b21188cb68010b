"""Where port claims live and which of them to believe: the lock dir, its flock, claim files.

Other users may share the node: nothing in a shared lock dir is trusted unless its owner,
type and content make sense, and a lock someone else holds is waited for a bounded time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jsr_base import BootstrapError, short_hostname
from trust import open_regular, private_dir, read_regular, real_dir, user_temp_dir

SHARED_LOCK_DIR = Path("/tmp/jupyter-slurm-ray-ports")  # used only if a site provides it
LOCK_WAIT = 10.0  # s, then go on without the lock
MAX_CLAIM_FILES = 2000  # a flood of planted files must not stall the start
PORT_MIN, PORT_MAX = 1024, 65535
MAX_BLOCK = 11 + 10000

Notify = Callable[[str], None]  # the reason of a port_lock_unavailable event


def process_start_time(pid: int) -> int | None:
    """Start time of a live (non-zombie) process in clock ticks, None if there is none."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if after_name[0] in ("Z", "X") else int(after_name[19])


def process_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def lock_dir_for(configured: str | Path | None, notify: Notify) -> Path | None:
    """The configured dir, the site's shared one (root's, sticky), else this user's own.

    None when not even this user's own dir can be made (then only the bind probe protects).
    """
    if configured:
        try:
            real_dir(Path(configured))
            return Path(configured)
        except BootstrapError as exc:
            notify(f"the configured lock_dir cannot be used: {exc.reason}; using a private one")
    with contextlib.suppress(OSError):
        info = os.lstat(SHARED_LOCK_DIR)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and info.st_mode & stat.S_ISVTX:
            return SHARED_LOCK_DIR
    try:
        return private_dir(user_temp_dir(node_wide=True) / "ports")
    except (OSError, BootstrapError) as exc:
        notify(f"no private port lock dir: {exc}")
        return None


def lock_holder(fd: int) -> str:
    """`pid N (uid U)` holding a flock on fd's file, from /proc/locks, or ''."""
    inode = os.fstat(fd).st_ino
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF"
        words = line.split()
        if len(words) > 5 and words[1] == "FLOCK" and words[5].endswith(f":{inode}"):
            pid = int(words[4]) if words[4].isdigit() else 0
            return f"pid {pid} (uid {process_uid(pid)})" if pid else ""
    return ""


@contextlib.contextmanager
def port_lock(lock_dir: Path | None, notify: Notify, wait: float = LOCK_WAIT) -> Iterator[bool]:
    """Exclusive flock on lock_dir/lock, waited for at most `wait` s; yields whether it is held.

    The file is opened read-only (flock needs no more), without following a symlink and
    without blocking on a FIFO; anything but a plain file is refused.
    """
    if lock_dir is None:
        yield False
        return
    path = lock_dir / "lock"
    try:
        fd = open_regular(path, create=True)
    except OSError as exc:
        notify(f"cannot open the port lock {path}: {exc}")
        yield False
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = lock_holder(fd)
                    notify(
                        f"the port lock {path} stayed locked for {wait:g} s"
                        + (f" by {holder}" if holder else "")
                        + "; going on without it (every port is still probed)"
                    )
                    held = False
                    break
                time.sleep(0.05)
        yield held
    finally:
        os.close(fd)


def plausible_claim(path: Path) -> dict[str, Any] | None:
    """A claim file's content if it is a plain file of sane JSON written by the uid it names."""
    try:
        data, info = read_regular(path)
        claim = json.loads(data)
    except (OSError, ValueError):
        return None
    if not isinstance(claim, dict):
        return None
    numbers = [claim.get(key) for key in ("start", "size", "pid", "uid")]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        return None
    start, size, pid, uid = (int(n) for n in numbers)  # type: ignore[arg-type]
    if not (start >= PORT_MIN and 1 <= size <= MAX_BLOCK and start + size - 1 <= PORT_MAX):
        return None
    return claim if pid > 0 and info.st_uid == uid else None


def claim_is_live(claim: dict[str, Any]) -> bool:
    """Its process still runs, as the claiming user (same start time when recorded)."""
    started = process_start_time(claim["pid"])
    return (
        started is not None
        and claim.get("pid_start") in (None, started)
        and process_uid(claim["pid"]) == claim["uid"]
    )


def live_claims(lock_dir: Path | None) -> list[dict[str, Any]]:
    """Believable claims of live processes; this user's stale claims are removed."""
    if lock_dir is None:
        return []
    claims = []
    with contextlib.suppress(OSError), os.scandir(lock_dir) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_CLAIM_FILES:
                break
            if not entry.name.endswith(".claim"):
                continue
            claim = plausible_claim(Path(entry.path))
            if claim is None:
                continue
            if claim_is_live(claim):
                claims.append(claim)
            elif claim["uid"] == os.getuid():
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    return claims


def write_claim(
    lock_dir: Path | None, start: int, size: int, job: str, notify: Notify
) -> Path | None:
    """Record the block in a claim file (written whole, then renamed); None if impossible."""
    if lock_dir is None:
        return None
    pid = os.getpid()
    claim = {"start": start, "size": size, "job_id": job, "pid": pid, "host": short_hostname()}
    claim.update(pid_start=process_start_time(pid), uid=os.getuid(), t=time.time())
    name = f"{start}-{pid}-{secrets.token_hex(4)}.claim"
    tmp = lock_dir / f".{name}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.fchmod(fd, 0o644)  # other users of a shared lock dir read it whatever the umask
        with os.fdopen(fd, "w") as handle:
            json.dump(claim, handle)
        os.rename(tmp, lock_dir / name)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        notify(f"cannot write a port claim in {lock_dir}: {exc}")
        return None
    return lock_dir / name
