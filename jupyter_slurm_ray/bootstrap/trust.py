"""What the bootstrap may trust on a shared node: the job dir's path (modes, owners, ACLs),
private dirs, plain files."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from acls import acl_problem
from jsr_base import BootstrapError

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
USER_TEMP_NAMES = 8  # /tmp/jsr-<uid>, then -1 … -7: how many names a squatter must take


def path_problem(path: Path, uid: int) -> str | None:
    """Why path (absolute, symlinks resolved) could be changed by another user, or None.

    The directory and each parent up to / must belong to uid or root and be writable by
    neither group nor others, through their mode or an ACL (``acls.py``; the directory's own
    default ACL too: what is created in it gets it), except root's sticky directories such
    as /tmp.
    """
    for directory in (path, *path.parents):
        try:
            info = os.stat(directory)
        except OSError as exc:
            return f"{directory} cannot be checked: {exc.strerror}"
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (uid, 0):
            return f"{directory} belongs to uid {info.st_uid}, not to this user (uid {uid}) or root"
        granted = acl_problem(str(directory), uid, created_here=directory == path)
        if granted:
            return granted
        if mode & 0o022 and not (info.st_uid == 0 and mode & stat.S_ISVTX):
            who = (
                "group and others"
                if mode & 0o022 == 0o022
                else "group"
                if mode & 0o020
                else "others"
            )
            return f"{directory} is writable by {who} (mode {mode:04o})"
    return None


def check_job_dir(job_dir: Path) -> None:
    problem = path_problem(job_dir, os.getuid())
    if problem:
        raise BootstrapError(
            f"the job dir {job_dir} is not safe to run from: {problem}; "
            "nothing was started (use a job dir only you can change)"
        )


def private_dir(path: Path) -> Path:
    """path as a directory only this user can enter (refuses one owned by someone else)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise BootstrapError(f"{path} exists and is not a directory of this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def user_temp_dir(node_wide: bool = False) -> Path:
    """This user's private dir under /tmp (Ray's temp dirs, port locks, unpacked packs).

    /tmp/jsr-<uid>, found again by every job of this user on the node. Anyone can create that
    name first: then the first of /tmp/jsr-<uid>-1 … -7 that is this user's, and past those a
    fresh private one (nothing is shared between this user's jobs then, but the job runs).
    node_wide (port claims, unpacked packs: what this user's other jobs on the node must see):
    under /var/tmp instead when this job's /tmp is its own (``tmp_private_to_job``).
    """
    parent = "/var/tmp" if node_wide and tmp_private_to_job() else "/tmp"
    base = f"{parent}/jsr-{os.getuid()}"
    for name in (base, *(f"{base}-{n}" for n in range(1, USER_TEMP_NAMES))):
        try:
            return private_dir(Path(name))
        except (BootstrapError, OSError) as exc:
            print(f"jupyter-slurm-ray: not using {name}: {exc}", file=sys.stderr)
    return Path(tempfile.mkdtemp(prefix=f"jsr-{os.getuid()}-", dir=parent))


def tmp_private_to_job(mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether /tmp is a directory bound there for this job alone: its mount shows a root
    other than "/" (Slurm's job_container/tmpfs binds <BasePath>/<job>/.tmp, as do SPANK
    plugins such as auto_tmpdir). Slurm's usual Dirs=/tmp,/dev/shm leave /var/tmp node-wide."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return False
    root = None  # of the last mount on /tmp: the one this job sees
    for fields in (line.split() for line in lines):
        if len(fields) > 4 and fields[4] == "/tmp":
            root = fields[3]
    return root not in (None, "/")


def real_dir(path: Path) -> os.stat_result:
    """lstat of a directory that is not a symlink, or BootstrapError saying what it is."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise BootstrapError(f"{path} cannot be used: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise BootstrapError(f"{path} is {kind}")
    return info


def open_regular(path: Path, create: bool = False) -> int:
    """A read-only fd on a plain file: no symlink followed, no FIFO waited on (OSError if not).

    With create, a missing file is made 0644 (others can open and flock it read-only).
    """
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
        try:
            fd = os.open(path, READ_FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o644)
        except FileExistsError:  # made meanwhile by someone else
            fd = os.open(path, READ_FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def read_regular(path: Path, limit: int = 4096) -> tuple[bytes, os.stat_result]:
    """The first limit bytes of a plain file and its fstat (OSError for anything else)."""
    fd = open_regular(path)
    try:
        return os.read(fd, limit), os.fstat(fd)
    finally:
        os.close(fd)
