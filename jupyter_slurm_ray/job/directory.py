"""The job dir of one cluster on the cluster's filesystem: the only place that knows its layout.

``job.sbatch``, ``bootstrap/`` (the bootstrap package), ``bootstrap.json`` (its settings),
``ray_token`` (0600), ``lease`` (rewritten by the owner), ``detached`` (marker),
``events.jsonl``, ``connection.json``, ``head.json``, ``nodes.json`` and ``tls/`` (the cluster's CA
and the clients' certificate: written by the bootstrap), ``slurm-<job>.out|err`` and
``logs/ray-{head,worker}-<host>.log``. The directory itself is 0700.

The job dir root must be a tree only the user (or root) can change, by mode or by ACL: every
directory on its path is checked before anything is written (see :func:`probe_site`), the job
dir is created fresh (never reused), and the job script checks its job dir again before
running from it (the bootstrap too, ACLs included).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..bootstrap.jsr_wire import (
    CONNECTION_FILE,
    DETACHED_FILE,
    EVENTS_FILE,
    LEASE_FILE,
    LOGS_DIR,
    PROGRAM_DIR,
    SETTINGS_FILE,
    TLS_CA_CERT,
    TLS_CLIENT_CERT,
    TLS_CLIENT_KEY,
    TLS_DIR,
    TOKEN_FILE,
    Role,
    Run,
    drain_file,
    ray_log,
)
from ..errors import CommandError, SlurmRayError, SpecError
from ..spec.checks import python_command
from ..spec.environment import exported_names, parse_env0
from ..transport import LocalTransport, Transport, tar_base64
from .shipping import bootstrap_files

SCRIPT = "job.sbatch"


_UNTRUSTED_EXIT = 6
# Constant program (``sh -c PROBE sh ROOT ACL_CHECK``): resolves the job dir root ("~/" against
# $HOME, symbolic links followed); runs ACL_CHECK (``bootstrap/acls.py``, with python3) on the
# deepest existing directory of the root and on its packs dir, or, without a python3 that runs
# it, refuses any ACL that ls shows (+); checks the owner and mode of every existing directory
# on the path (from the packs dir up); then prints HOME NUL ROOT NUL and the environment
# (NUL-separated) whose variable names the job exports.
_PROBE = (
    "root=$1 acl_check=$2; "
    'case $root in "~") root=$HOME ;; "~/"*) root=$HOME/${root#"~/"} ;; esac; '
    'real=$(realpath -m -- "$root") || exit 5; uid=$(id -u); d=$real; '
    'while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done; '
    'set -- "$d"; [ -d "$real/packs" ] && set -- "$@" "$real/packs"; '
    "rc=127; command -v python3 >/dev/null 2>&1 && "
    '{ python3 -I -S -c "$acl_check" "$@"; rc=$?; }; '
    "[ $rc = 6 ] && exit 6; "
    'if [ $rc != 0 ]; then for d in "$@"; do while :; do '
    'case $(ls -ld -- "$d" 2>/dev/null) in ??????????+*) '
    'echo "$d has an ACL (ls -ld shows +) and no python3 here could check who may write '
    'there; remove it with \\`setfacl -b $d\\`" >&2; exit 6 ;; esac; '
    '[ "$d" = / ] && break; d=$(dirname -- "$d"); done; done; fi; '
    'd=$real; [ -d "$real/packs" ] && d=$real/packs; '
    "while :; do "
    'if [ -e "$d" ]; then '
    "set -- $(stat -c '%u %a' -- \"$d\"); "
    'if [ "$1" != "$uid" ] && [ "$1" != 0 ]; then '
    'echo "$d belongs to uid $1, not to you or root" >&2; exit 6; fi; '
    'if [ $((0$2 & 18)) != 0 ] && { [ "$1" != 0 ] || [ $((0$2 & 512)) = 0 ]; }; then '
    'echo "$d is writable by other users (mode $2)" >&2; exit 6; fi; '
    "fi; "
    '[ "$d" = / ] && break; d=$(dirname -- "$d"); '
    "done; "
    'printf \'%s\\0%s\\0\' "$HOME" "$real"; exec env -0'
)
# Constant program (``sh -c CREATE sh ROOT NAME``): the job dir, fresh, with its files
# from a base64 tar on stdin, in one command (one round trip over SSH).
_CREATE = (
    'umask 077; mkdir -p -- "$1" && mkdir -- "$1/$2" && '
    'base64 -d | tar -x -f - -C "$1/$2" --no-same-owner --no-same-permissions'
)


@dataclass(frozen=True)
class Site:
    """What the submitting side looks like: its home, the job dir root, exported names."""

    home: str
    job_dir_root: str  # absolute, symbolic links resolved, checked
    exported: tuple[str, ...]


async def probe_site(
    transport: Transport, job_dir_root: str, export_env: Sequence[str] = ()
) -> Site:
    """One command: resolve and check ``job_dir_root``, and list the exported variables
    (the default list and ``export_env``: ``spec/environment.py``).

    SpecError (field job_dir_root) when a directory on its path belongs to another user or
    is writable by others, through its mode or an ACL (root's sticky directories like /tmp
    excepted); the packs dir beside the job dirs too.
    """
    argv = ["sh", "-c", _PROBE, "sh", job_dir_root, acl_check_program()]
    result = await transport.run(argv, check=False)
    if result.returncode == _UNTRUSTED_EXIT:
        allowed = (
            "a directory tree only you (or root) can change: "
            f"{result.stderr.strip()}; choose another job_dir_root or fix the permissions"
        )
        raise SpecError("job_dir_root", job_dir_root, allowed)
    if result.returncode != 0:
        raise CommandError(list(argv[:2]), result.returncode, result.stdout, result.stderr)
    home, rest = result.stdout.split("\0", 1) if "\0" in result.stdout else ("", "")
    root, _, env = rest.partition("\0")
    if not root.startswith("/"):
        raise SlurmRayError(f"cannot resolve the job dir root {job_dir_root!r} on the cluster")
    _, names = parse_env0("\0" + env)
    return Site(home, root, tuple(exported_names(names, export_env)))


def acl_check_program() -> str:
    """The source of ``bootstrap/acls.py``: the same ACL check on the login node as on the
    nodes (run by ``python3 -c``)."""
    return bootstrap_files()["acls.py"]


class JobDir:
    """Reads and writes the files of one cluster's job dir through a Transport."""

    def __init__(self, transport: Transport, path: str) -> None:
        self.transport = transport
        self.path = path.rstrip("/")

    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def bootstrap_command(
        self, python: str | None, run: str = Run.HEAD, *, local_mode: bool = False
    ) -> list[str]:
        """The job's command: the shipped bootstrap package run as a directory, as ``run``
        (``Run.HEAD``: a cluster's job; ``Run.WORKER_JOB``: a worker job's).

        ``python`` None (not set): this kernel's own environment when Slurm runs here (its
        ``bin`` first on PATH, as an activation would put it, so ``ray`` is found), after
        :func:`kernel_environment` judged that the compute nodes share it; ``python3`` over SSH.
        ``local_mode``: this machine runs the job, so no node needs to share the environment.
        """
        program = [self.file(PROGRAM_DIR), run, self.path]
        if python is not None:
            return [python, *program]
        if local_mode:
            return [*kernel_python_argv(KernelEnvironment.of_this_process()), *program]
        if not isinstance(self.transport, LocalTransport):
            return ["python3", *program]
        return [*kernel_python_argv(kernel_environment(os.path.dirname(self.path))), *program]

    async def create(self, settings: Mapping[str, Any], *, script: str, lease: str) -> None:
        """Create the directory, fresh (it must not exist), with the job script, the bootstrap,
        its settings (``bootstrap.json``: ``script.bootstrap_settings``), the owner's first
        lease and a new Ray token: one command whatever the transport (one round trip over SSH)."""
        files = {f"{PROGRAM_DIR}/{name}": text for name, text in bootstrap_files().items()}
        files[SETTINGS_FILE] = json.dumps(dict(settings), indent=1)
        files[TOKEN_FILE] = secrets.token_urlsafe(32) + "\n"
        files[LEASE_FILE] = lease
        files[SCRIPT] = script
        files[f"{LOGS_DIR}/.keep"] = ""
        root, _, name = self.path.rpartition("/")
        archive = tar_base64(files)
        try:
            await self.transport.run(["sh", "-c", _CREATE, "sh", root or "/", name], input=archive)
        except CommandError as exc:
            raise SlurmRayError(f"cannot create the job dir {self.path}: {exc}") from None

    async def remove(self) -> None:
        await self.transport.run(["rm", "-rf", "--", self.path], check=False)

    async def write_lease(self, content: str) -> None:
        await self.transport.write_file(self.file(LEASE_FILE), content, 0o600)

    async def mark_detached(self, content: str) -> None:
        await self.transport.write_file(self.file(DETACHED_FILE), content, 0o600)

    async def read_events(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """Events appended since ``offset`` (whole lines only) and the new offset."""
        text, offset = await self.transport.read_from(self.file(EVENTS_FILE), offset)
        return parse_events(text), offset

    async def recent_events(self, count: int) -> list[dict[str, Any]]:
        """The last ``count`` events (SlurmRayError when they cannot be read)."""
        return parse_events(await self.transport.tail(self.file(EVENTS_FILE), count))

    async def read_lease(self) -> str | None:
        """The lease's text; None when there is none."""
        return await self.transport.read_file_if_exists(self.file(LEASE_FILE))

    async def request_drain(self, job_id: str, timeout: float) -> None:
        """Ask worker job ``job_id`` to drain and leave within ``timeout`` seconds."""
        await self.transport.write_file(self.file(drain_file(job_id)), f"{timeout:g}\n", 0o600)

    async def read_connection(self) -> str:
        return await self.transport.read_file(self.file(CONNECTION_FILE))

    async def read_connection_if_ready(self) -> str | None:
        return await self.transport.read_file_if_exists(self.file(CONNECTION_FILE))

    async def read_token(self) -> str:
        return (await self.transport.read_file(self.file(TOKEN_FILE))).strip()

    async def read_client_tls(self) -> tuple[str, str, str]:
        """The clients' certificate, its key and the cluster's CA (``tls/``, made by the head
        before Ray started)."""
        names = (TLS_CLIENT_CERT, TLS_CLIENT_KEY, TLS_CA_CERT)
        cert, key, ca = [await self.transport.read_file(self.file(f"{TLS_DIR}/{n}")) for n in names]
        return cert, key, ca

    async def logs(self, job_id: str | None, node: str | None = None, tail: int = 100) -> str:
        """The job's output (``node=None``) or one node's Ray log, last ``tail`` lines each."""
        if node is not None:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", node):
                raise SlurmRayError(f"node: {node!r} is not a host name")
            roles = (Role.HEAD, Role.WORKER, Role.DRIVER)
            names = [f"{LOGS_DIR}/{ray_log(role, node)}" for role in roles]
        else:
            names = [f"slurm-{job_id}.out", f"slurm-{job_id}.err"] if job_id else []
        parts = []
        for name in names:
            text = await self.transport.tail(self.file(name), tail)
            if text:
                parts.append(f"==> {name} <==\n{text.rstrip()}")
        return "\n".join(parts)


# ----------------------------------------------------------------------------- the kernel's Python

# Constant program (``sh -c PROGRAM BIN_DIR PYTHON ARG...``): PYTHON run with BIN_DIR first on PATH.
_BIN_FIRST_ON_PATH = 'PATH="$0:$PATH"; export PATH; exec "$@"'

# Filesystem types (as in /proc/self/mountinfo) that compute nodes mount from elsewhere.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "fuse.ceph-fuse",
        "glusterfs",
        "fuse.glusterfs",
        "panfs",
        "wekafs",
        "cvfs",
        "pvfs2",
        "orangefs",
        "afs",
        "cifs",
        "smb3",
        "fuse.sshfs",
    }
)
# Where an operating system keeps its own Python: every node of a site has its image.
_SYSTEM_PREFIXES = ("/usr/", "/bin/")


@dataclass(frozen=True)
class KernelEnvironment:
    """This process's Python environment, as the cluster's Python when ``python`` is not set."""

    python: str  # sys.executable, not resolved (a venv's python is a link to its base)
    prefix: str  # the environment (venv or conda env) with its site-packages
    base: str  # the interpreter's real file (in a venv: the base Python's)

    @property
    def bin_dir(self) -> str:
        return os.path.dirname(self.python)

    @classmethod
    def of_this_process(cls) -> KernelEnvironment:
        return cls(sys.executable, sys.prefix, os.path.realpath(sys.executable))


def kernel_python_argv(env: KernelEnvironment) -> list[str]:
    """The argv that runs ``env``'s Python with its ``bin`` first on PATH (so ``ray`` is found)."""
    return ["sh", "-c", _BIN_FIRST_ON_PATH, env.bin_dir, env.python]


def kernel_environment(
    job_dir_root: str, env: KernelEnvironment | None = None
) -> KernelEnvironment:
    """This kernel's environment, if the compute nodes can run it; else SpecError (python)
    saying what to set.

    Judged here, on the login node, without a job: the environment is taken as shared when it
    is on the job dir root's filesystem (which the nodes must share anyway: the bootstrap runs
    from there) or on a network filesystem (nfs, lustre, gpfs, ...); a base interpreter under
    /usr also counts (the nodes run the same system image). ``doctor`` checks it for real.
    """
    env = env or KernelEnvironment.of_this_process()
    fix = (
        "set python to a Python with ray installed that the compute nodes can run (same Ray "
        "and Python minor version as this kernel), and setup to the lines that make it work "
        "there (module load ..., source .../bin/activate); `%slurm_ray doctor` checks them on "
        "a compute node"
    )
    try:
        python_command("python", env.python)
    except SpecError:
        allowed = f"this kernel's Python (used when python is not set) has an unusual path: {fix}"
        raise SpecError("python", env.python, allowed) from None
    root_device = _device(_existing_ancestor(job_dir_root))
    places = [("environment", env.prefix)]
    if not env.base.startswith(_SYSTEM_PREFIXES):
        places.append(("interpreter", env.base))
    for what, path in places:
        device = _device(path)
        kind = filesystem_type(path)
        if device is not None and device == root_device:
            continue
        if kind in NETWORK_FILESYSTEMS:
            continue
        allowed = (
            f"this kernel's Python (used when python is not set) is not on a filesystem the "
            f"compute nodes share: its {what} {path} is on {kind or 'an unknown filesystem'}, "
            f"neither the job dir root's ({job_dir_root}) nor a network filesystem; {fix}"
        )
        raise SpecError("python", env.python, allowed)
    return env


def _existing_ancestor(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.exists(path) and path != "/":
        path = os.path.dirname(path)
    return path


def _device(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def filesystem_type(path: str, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem ``path`` is on (its mount point in /proc/self/mountinfo)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
                mountinfo = handle.read()
        except OSError:
            return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, kind = mount_point, line.split(" - ", 1)[1].split()[0]
    return kind


def parse_events(text: str) -> list[dict[str, Any]]:
    """One JSON object per line; a torn or foreign line is skipped, not fatal."""
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events
