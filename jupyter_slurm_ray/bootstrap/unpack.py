"""The environment pack on this node: unpacked once onto local disk, then put first on PATH.

The job names the archive in JSR_ENV_PACK (``packs.py`` on the client side):
``<job dir root>/packs/env-<kind>-<key>.<ext>``. It is unpacked into
``/tmp/jsr-<uid>/env-<kind>-<key>``, shared by this user's clusters on the node: under a lock
(two jobs never unpack the same pack at once), into a temporary directory renamed when
complete, with a marker written last; a directory with the marker is reused. The marker's
mtime is renewed at each use; unpacked packs unused for PRUNE_AFTER are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from jsr_base import BootstrapError, command_path, short_hostname
from trust import user_temp_dir

PACK_VARIABLE = "JSR_ENV_PACK"
PACK_FILE = "env-pack"  # in the job dir: the archive, for the worker jobs
MARKER = ".jsr-unpacked"
LOCK_WAIT = 900.0  # s to wait for another job unpacking the same pack on this node
UNPACK_TIMEOUT = 1800.0
PRUNE_AFTER = 7 * 86400.0  # s since an unpacked pack was last used
_NAME = re.compile(r"env-(venv|conda|pixi)-([0-9a-f]{16})\.(tar\.gz|tar)")

Emit = Callable[..., None]


def activate_pack(
    emit: Emit, job_dir: Path, environ: dict[str, str] | os._Environ[str] = os.environ
) -> None:
    """If the job has a pack: unpack it on this node (once) and put its ``bin`` first on PATH
    of this process (so `ray`, its Python and Ray's processes are the pack's). No pack: no-op.

    The cluster's job names it in JSR_ENV_PACK; its worker jobs (scaling) find it in the job
    dir's ``env-pack``, which the first node to see the variable writes."""
    archive = environ.get(PACK_VARIABLE) or _named_in(job_dir / PACK_FILE)
    if not archive:
        return
    if not (job_dir / PACK_FILE).exists():
        write_text_atomic(job_dir / PACK_FILE, archive + "\n")
    started = time.monotonic()
    prefix, reused = unpacked(Path(archive))
    bin_dir = str(prefix / "bin")
    if environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        environ["PATH"] = os.pathsep.join(p for p in (bin_dir, environ.get("PATH", "")) if p)
    environ["VIRTUAL_ENV" if (prefix / "pyvenv.cfg").exists() else "CONDA_PREFIX"] = str(prefix)
    environ.pop("PYTHONHOME", None)
    emit("env_pack", prefix=str(prefix), reused=reused, seconds=time.monotonic() - started)


def _named_in(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def write_text_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def unpacked(archive: Path) -> tuple[Path, bool]:
    """The environment prefix unpacked from ``archive`` on this node, and whether it was
    there already; BootstrapError naming the node and the archive when it cannot be."""
    match = _NAME.fullmatch(archive.name)
    if match is None:
        raise BootstrapError(f"{PACK_VARIABLE}={archive} does not name an environment pack")
    kind = match.group(1)
    parent = user_temp_dir()
    target = parent / f"env-{kind}-{match.group(2)}"
    with _node_lock(parent / f"{target.name}.lock"):
        marker = target / MARKER
        if marker.is_file():
            os.utime(marker)
            return _prefix(target, kind), True
        _unpack(archive, kind, target)
    prune_unused(parent, keep=target)
    return _prefix(target, kind), False


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


def _unpack(archive: Path, kind: str, target: Path) -> None:
    """Into a temporary directory, renamed to ``target``; fixed up there; marker last."""
    shutil.rmtree(target, ignore_errors=True)  # an unfinished earlier attempt
    temp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(mode=0o700)
    try:
        if kind == "pixi":
            _run([_tool("pixi-unpack", archive), str(archive), "--output-directory", str(temp)])
        else:
            _run(["tar", "-x", "-f", str(archive), "-C", str(temp)], archive)
        os.rename(temp, target)
        if kind == "conda":  # conda-pack: rewrite the prefixes for where it now is
            _run([str(target / "bin" / "python"), str(target / "bin" / "conda-unpack")], archive)
        _check_python(_prefix(target, kind), archive)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        raise
    (target / MARKER).write_text(f"{archive}\n")


def _tool(name: str, archive: Path) -> str:
    where = f"{archive} on {short_hostname()}"
    return command_path(name, f"cannot unpack {where}: {name} is not on PATH there")


def _run(argv: list[str], archive: Path | None = None) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=UNPACK_TIMEOUT, check=False
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
