"""The environment pack on this node: checked, unpacked once onto local disk, put first on PATH.

The job names the archive in JSR_ENV_PACK (``job/packs.py`` on the client side):
``<job dir root>/packs/env-<kind>-<key>.<ext>``, and the content it must have in
JSR_ENV_PACK_SHA256 (the sha256 of the archive when ``up`` took it). Before anything is
unpacked, the archive's directory must pass the job dir's trust check (``trust.py``), the file
must be this user's and changeable by no one else, and its content must have that hash: read
through one open file, which is then what is unpacked (a file swapped by its path afterwards is
not). A different content is refused (event ``env_pack_replaced``): nothing is unpacked.

It is unpacked into ``/tmp/jsr-<uid>/env-<kind>-<key>-<sha256 prefix>`` (``/var/tmp/jsr-<uid>``
when the job's /tmp is its own: ``trust.user_temp_dir``), shared by this user's clusters on
the node: under a lock (two jobs never unpack the same pack at once), into a
temporary directory renamed when complete, with a marker (the full hash) written last; a
directory whose marker has the hash is reused. The marker's mtime is renewed at each use;
unpacked packs unused for PRUNE_AFTER are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from acls import acl_problem
from jsr_base import BootstrapError, command_path, short_hostname
from jsr_wire import PACK_FILE, PACK_SHA256_VARIABLE, PACK_VARIABLE, Event
from trust import open_regular, path_problem, user_temp_dir

MARKER = ".jsr-unpacked"
LOCK_WAIT = 900.0  # s to wait for another job unpacking the same pack on this node
UNPACK_TIMEOUT = 1800.0
PRUNE_AFTER = 7 * 86400.0  # s since an unpacked pack was last used
_NAME = re.compile(r"env-(venv|conda|pixi)-([0-9a-f]{16})\.(tar\.gz|tar)")
_SHA256 = re.compile(r"[0-9a-f]{64}")

Emit = Callable[..., None]


class PackReplaced(BootstrapError):
    """The archive's content is not the one the job was submitted with."""

    def __init__(self, archive: Path, expected: str, found: str) -> None:
        super().__init__(
            f"the environment pack {archive} on {short_hostname()} is not the one this cluster "
            f"was started with: its content has sha256 {found}, not {expected} (it was replaced "
            "after up); nothing was unpacked. Remove it (rm "
            f"{archive}) and run up again to pack and ship it afresh"
        )
        self.archive, self.expected, self.found = archive, expected, found


def activate_pack(
    emit: Emit, job_dir: Path, environ: dict[str, str] | os._Environ[str] = os.environ
) -> None:
    """If the job has a pack: unpack it on this node (once) and put its ``bin`` first on PATH
    of this process (so `ray`, its Python and Ray's processes are the pack's). No pack: no-op.

    The cluster's job names it in JSR_ENV_PACK and JSR_ENV_PACK_SHA256; its worker jobs
    (scaling) find both in the job dir's ``env-pack``, which the first node to see the
    variables writes."""
    archive, sha256 = environ.get(PACK_VARIABLE), environ.get(PACK_SHA256_VARIABLE)
    if not archive:
        archive, sha256 = _named_in(job_dir / PACK_FILE)
    if not archive:
        return
    if not sha256 or not _SHA256.fullmatch(sha256):
        raise BootstrapError(
            f"the job names the environment pack {archive} without its content hash "
            f"({PACK_SHA256_VARIABLE}): it was started by an older version; run up again"
        )
    if not (job_dir / PACK_FILE).exists():
        write_text_atomic(job_dir / PACK_FILE, f"{archive}\n{sha256}\n")
    started = time.monotonic()
    try:
        prefix, reused = unpacked(Path(archive), sha256)
    except PackReplaced as exc:
        emit(Event.ENV_PACK_REPLACED, archive=archive, expected=exc.expected, found=exc.found)
        raise
    bin_dir = str(prefix / "bin")
    if environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        environ["PATH"] = os.pathsep.join(p for p in (bin_dir, environ.get("PATH", "")) if p)
    environ["VIRTUAL_ENV" if (prefix / "pyvenv.cfg").exists() else "CONDA_PREFIX"] = str(prefix)
    environ.pop("PYTHONHOME", None)
    emit(Event.ENV_PACK, prefix=str(prefix), reused=reused, seconds=time.monotonic() - started)


def _named_in(path: Path) -> tuple[str, str]:
    """The archive and its hash that the job dir's ``env-pack`` names ("" when none)."""
    try:
        lines = path.read_text().split()
    except OSError:
        return "", ""
    return (lines[0] if lines else ""), (lines[1] if len(lines) > 1 else "")


def write_text_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def unpacked(archive: Path, sha256: str) -> tuple[Path, bool]:
    """The environment prefix unpacked from ``archive`` (which must have the content
    ``sha256``) on this node, and whether it was there already; BootstrapError naming the
    node and the archive when it cannot be (PackReplaced when its content is another)."""
    match = _NAME.fullmatch(archive.name)
    if match is None:
        raise BootstrapError(f"{PACK_VARIABLE}={archive} does not name an environment pack")
    kind = match.group(1)
    parent = user_temp_dir(node_wide=True)
    target = parent / f"env-{kind}-{match.group(2)}-{sha256[:16]}"
    with _node_lock(parent / f"{target.name}.lock"):
        marker = target / MARKER
        if marker.is_file() and _marked(marker) == sha256:
            os.utime(marker)
            return _prefix(target, kind), True
        fd = verified_archive(archive, sha256)
        try:
            _unpack(fd, archive, kind, target, sha256)
        finally:
            os.close(fd)
    prune_unused(parent, keep=target)
    return _prefix(target, kind), False


def verified_archive(archive: Path, sha256: str) -> int:
    """A read-only fd on ``archive``, at its start, once its directory passed the trust check,
    the file proved to be this user's (or root's) and changeable by no one else, and its
    content hashed to ``sha256`` (else BootstrapError, PackReplaced for another content)."""
    problem = path_problem(archive.parent, os.getuid())
    if problem:
        raise BootstrapError(
            f"the environment pack's directory {archive.parent} is not safe to unpack from: "
            f"{problem}"
        )
    try:
        fd = open_regular(archive)
    except OSError as exc:
        raise BootstrapError(f"cannot read the environment pack {archive}: {exc}") from None
    try:
        _check_file(fd, archive)
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise PackReplaced(archive, sha256, digest.hexdigest())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_file(fd: int, archive: Path) -> None:
    info = os.fstat(fd)
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (os.getuid(), 0):
        problem = f"it belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}) or root"
    elif mode & 0o022:
        problem = f"it is writable by other users (mode {mode:04o})"
    else:
        problem = acl_problem(str(archive), os.getuid()) or ""
    if problem:
        raise BootstrapError(f"the environment pack {archive} is not safe to unpack: {problem}")


def _marked(marker: Path) -> str:
    with contextlib.suppress(OSError, IndexError):
        return marker.read_text().split()[0]
    return ""


def _prefix(target: Path, kind: str) -> Path:
    return target / "env" if kind == "pixi" else target


@contextlib.contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BootstrapError(
                        f"another job held {path} on {short_hostname()} for {LOCK_WAIT:g} s "
                        "(unpacking the same environment pack)"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def _unpack(fd: int, archive: Path, kind: str, target: Path, sha256: str) -> None:
    """From the open, verified archive ``fd``: into a temporary directory, renamed to
    ``target``; fixed up there; the marker (its hash) last."""
    shutil.rmtree(target, ignore_errors=True)  # an unfinished earlier attempt
    temp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(mode=0o700)
    try:
        if kind == "pixi":  # pixi-unpack reads a path: the open file's, not the name's
            tool = _tool("pixi-unpack", archive)
            _run([tool, f"/dev/fd/{fd}", "--output-directory", str(temp)], archive, fd)
        else:
            gzip = ["-z"] if archive.name.endswith(".gz") else []
            _run(["tar", "-x", *gzip, "-f", "-", "-C", str(temp)], archive, fd)
        os.rename(temp, target)
        if kind == "conda":  # conda-pack: rewrite the prefixes for where it now is
            _run([str(target / "bin" / "python"), str(target / "bin" / "conda-unpack")], archive)
        _check_python(_prefix(target, kind), archive)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        raise
    (target / MARKER).write_text(f"{sha256} {archive}\n")


def _tool(name: str, archive: Path) -> str:
    where = f"{archive} on {short_hostname()}"
    return command_path(name, f"cannot unpack {where}: {name} is not on PATH there")


def _run(argv: list[str], archive: Path | None = None, stdin: int | None = None) -> None:
    """``argv``, with the open archive ``stdin`` as its stdin (and as /dev/fd/N)."""
    try:
        done = subprocess.run(
            argv,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            pass_fds=() if stdin is None else (stdin,),
            capture_output=True,
            text=True,
            timeout=UNPACK_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BootstrapError(f"cannot unpack {archive} on {short_hostname()}: {exc}") from None
    if done.returncode != 0:
        lines = (done.stderr + done.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise BootstrapError(
            f"cannot unpack the environment pack {archive} on {short_hostname()}: "
            f"{Path(argv[0]).name} failed: {reason}",
            lines,
        )


def _check_python(prefix: Path, archive: Path) -> None:
    """The unpacked Python runs here (a venv's links to its base Python, which must exist)."""
    python = prefix / "bin" / "python"
    if not os.path.exists(python):  # follows the links: a missing base Python shows here
        link = os.path.realpath(python)
        raise BootstrapError(
            f"the environment pack {archive} cannot run on {short_hostname()}: its Python "
            f"links to {link}, which this node lacks (a venv pack needs the same base Python "
            "on the nodes)"
        )


def prune_unused(parent: Path, keep: Path, older_than: float = PRUNE_AFTER) -> list[Path]:
    """Remove this user's unpacked packs on the node not used for ``older_than`` s (and not
    being unpacked: their lock is free)."""
    removed = []
    for marker in parent.glob(f"env-*/{MARKER}"):
        target = marker.parent
        try:
            unused = time.time() - marker.stat().st_mtime > older_than
        except OSError:
            continue
        if target == keep or not unused:
            continue
        fd = os.open(parent / f"{target.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            marker.unlink()
            shutil.rmtree(target, ignore_errors=True)
            removed.append(target)
        except OSError:
            pass  # in use
        finally:
            os.close(fd)
    return removed
