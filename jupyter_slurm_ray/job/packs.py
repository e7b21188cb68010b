"""Environment packs (``environment = "pack"``): this kernel's environment packed once with the
established tool of its kind (venv-pack, conda-pack, pixi-pack) into a content-addressed
archive, shipped to ``<job dir root>/packs/`` when missing there, and unpacked on each node's
local disk by the bootstrap (``bootstrap/unpack.py``) before Ray starts.

The archive's name carries its key: a hash of the environment's kind, its Python version and
the sorted names and versions of the distributions installed in it. While nothing is installed
or removed, every ``up`` reuses the archive (here and on the cluster side). Each ``up`` also
takes the archive's content hash (sha256 of the file as it is on the cluster side) and names
it to the job beside the archive (``JSR_ENV_PACK_SHA256``): the nodes unpack only an archive
with that content, so a pack replaced after ``up`` is refused there, never run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .. import display
from ..bootstrap.jsr_wire import PACK_SHA256_VARIABLE, PACK_VARIABLE
from ..errors import SlurmRayError, SpecError
from ..spec import ClusterSpec
from ..transport import LocalTransport, Transport

log = logging.getLogger(__name__)

__all__ = [
    "EnvironmentToPack",
    "PackOnCluster",
    "bootstrap_command",
    "describe_environment",
    "environment_kind",
    "pack_argv",
    "pack_key",
    "prepare_pack",
    "ship_pack",
]

PACKS_DIR = "packs"  # under the job dir root
SUFFIX = {"venv": ".tar.gz", "conda": ".tar.gz", "pixi": ".tar"}
TOOL = {"venv": "venv-pack", "conda": "conda-pack", "pixi": "pixi-pack"}
INSTALL = {
    "venv": "pip install venv-pack (in this environment)",
    "conda": "conda install -c conda-forge conda-pack",
    "pixi": "pixi global install pixi-pack pixi-unpack (pixi-unpack is needed on the nodes too)",
}
PACK_TIMEOUT = 1800.0  # s a packing tool may take
HASH_TIMEOUT = 600.0  # s sha256sum of an archive on the cluster side may take

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


@dataclass(frozen=True)
class EnvironmentToPack:
    """A Python environment of this machine and the archive name it packs to."""

    kind: str  # venv | conda | pixi
    prefix: str
    key: str

    @property
    def archive_name(self) -> str:
        return f"env-{self.kind}-{self.key}{SUFFIX[self.kind]}"


@dataclass(frozen=True)
class PackOnCluster:
    """An archive as the job names it: its path on the cluster side and its content hash."""

    path: str
    sha256: str


def environment_kind(prefix: str, base_prefix: str) -> str:
    """venv, conda or pixi: what kind of environment ``prefix`` is; SpecError when none."""
    root = Path(prefix)
    if (root / "conda-meta").is_dir():
        inside_pixi = ".pixi" in root.parts and root.parent.name == "envs"
        return "pixi" if inside_pixi else "conda"
    if (root / "pyvenv.cfg").is_file() and os.path.realpath(prefix) != os.path.realpath(
        base_prefix
    ):
        return "venv"
    allowed = (
        f"'kernel' here: this kernel runs from {prefix}, not a venv, conda or pixi environment "
        "(a pack needs one)"
    )
    raise SpecError("environment", "pack", allowed)


def _check_venv(prefix: str) -> None:
    """venv-pack refuses a venv that also sees the system's site-packages: say so first."""
    try:
        config = (Path(prefix) / "pyvenv.cfg").read_text()
    except OSError:
        return
    for line in config.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "include-system-site-packages" and value.strip().lower() == "true":
            allowed = (
                f"'kernel' here: the venv {prefix} was made with --system-site-packages, "
                "which venv-pack cannot pack; make a venv without it"
            )
            raise SpecError("environment", "pack", allowed)


def installed_distributions(paths: Iterable[str]) -> list[str]:
    """Sorted ``name==version`` of the distributions found on ``paths``."""
    found = {
        f"{(dist.metadata['Name'] or '').lower()}=={dist.version}"
        for dist in metadata.distributions(path=list(paths))
    }
    return sorted(found)


def pack_key(kind: str, python_version: str, distributions: Iterable[str]) -> str:
    """16 hex digits naming what is installed: kind, Python version, distributions."""
    text = "\n".join([kind, python_version, *sorted(distributions)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe_environment(
    prefix: str | None = None, base_prefix: str | None = None
) -> EnvironmentToPack:
    """This kernel's environment (or ``prefix``'s, searched on this process's sys.path)."""
    prefix = prefix or sys.prefix
    kind = environment_kind(prefix, base_prefix or sys.base_prefix)
    if kind == "venv":
        _check_venv(prefix)
    inside = [p for p in sys.path if p.startswith(prefix.rstrip("/") + "/")]
    key = pack_key(kind, platform.python_version(), installed_distributions(inside))
    return EnvironmentToPack(kind, prefix, key)


def pack_argv(env: EnvironmentToPack, tool: str, output: str) -> list[str]:
    """The packing tool's command line writing ``env``'s archive to ``output``."""
    if env.kind == "venv":
        return [tool, "--prefix", env.prefix, "--output", output, "--format", "tar.gz",
                "--compress-level", "1", "--quiet"]  # fmt: skip
    if env.kind == "conda":
        return [tool, "--prefix", env.prefix, "--output", output, "--format", "tar.gz",
                "--compress-level", "1", "--n-threads", "-1", "--quiet"]  # fmt: skip
    project = Path(env.prefix).parents[2]  # <project>/.pixi/envs/<name>
    return [tool, "--environment", Path(env.prefix).name, "--platform", "linux-64",
            "--output-file", output, str(project / "pixi.toml")]  # fmt: skip


def find_tool(env: EnvironmentToPack) -> str:
    """The packing tool: beside this Python, else on PATH; SpecError saying how to get it."""
    name = TOOL[env.kind]
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        allowed = f"'kernel' here, or install {name} to pack this {env.kind} environment: "
        raise SpecError("environment", "pack", allowed + INSTALL[env.kind])
    return found


def local_archive(env: EnvironmentToPack, directory: Path) -> Path:
    """The archive in ``directory``, packed there first if missing (to a temporary name,
    renamed when complete, so a half-written archive is never taken for one)."""
    path = directory / env.archive_name
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = directory / f".{env.archive_name}.{os.getpid()}.tmp{SUFFIX[env.kind]}"
    argv = pack_argv(env, find_tool(env), str(temp))
    started = time.monotonic()
    _say(f"packing the {env.kind} environment {env.prefix} with {Path(argv[0]).name}")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PACK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        temp.unlink(missing_ok=True)
        raise SlurmRayError(f"packing {env.prefix} failed: {exc}") from None
    if done.returncode != 0:
        temp.unlink(missing_ok=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SlurmRayError(f"packing {env.prefix} with {argv[0]} failed:\n{tail}")
    os.replace(temp, path)
    size = path.stat().st_size / 1e6
    _say(f"packed {path.name} ({size:.0f} MB) in {time.monotonic() - started:.1f} s")
    return path


def _say(line: str) -> None:
    log.info("%s", line)
    print(f"[environment pack] {line}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where this machine keeps the packs it made and sent elsewhere, by archive name."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "jupyter-slurm-ray" / "packs"


def remote_archive(env: EnvironmentToPack, job_dir_root: str) -> str:
    return f"{job_dir_root.rstrip('/')}/{PACKS_DIR}/{env.archive_name}"


def _root_is_here(transport: Transport) -> bool:
    """True when the job dir root is this process's own filesystem, as this user."""
    return isinstance(transport, LocalTransport) and not transport.command_prefix


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


async def archive_sha256(transport: Transport, path: str) -> str | None:
    """The content hash of the archive ``path`` on the cluster side; None when it is missing."""
    if _root_is_here(transport):
        try:
            return await asyncio.to_thread(file_sha256, Path(path))
        except FileNotFoundError:
            return None
    program = '[ -f "$1" ] || exit 3; exec sha256sum -- "$1"'
    done = await transport.run(["sh", "-c", program, "sh", path], timeout=HASH_TIMEOUT, check=False)
    if done.returncode == 3:
        return None
    digest = done.stdout.split()[0] if done.returncode == 0 and done.stdout.split() else ""
    if len(digest) != 64:
        raise SlurmRayError(f"cannot hash the environment pack {path}: {done.stderr.strip()}")
    return digest


async def prepare_pack(
    transport: Transport, env: EnvironmentToPack, job_dir_root: str
) -> PackOnCluster:
    """The archive the job will name, with its content hash: the cluster side's copy if it
    has one; else this side's (packed first if missing), which ``ship_pack`` then sends."""
    remote = remote_archive(env, job_dir_root)
    digest = await archive_sha256(transport, remote)
    if digest is None:
        here = Path(remote).parent if _root_is_here(transport) else cache_dir()
        archive = await asyncio.to_thread(local_archive, env, here)
        digest = await asyncio.to_thread(file_sha256, archive)
    return PackOnCluster(remote, digest)


async def ship_pack(transport: Transport, env: EnvironmentToPack, job_dir_root: str) -> str:
    """The archive's path on the cluster side: packed here and sent there only if missing
    (and then checked to have arrived as it left)."""
    remote = remote_archive(env, job_dir_root)
    exists = await transport.run(["test", "-f", remote], check=False)
    if exists.returncode == 0:
        _say(f"reusing {remote}")
        return remote
    if _root_is_here(transport):
        await asyncio.to_thread(local_archive, env, Path(remote).parent)
        return remote
    archive = await asyncio.to_thread(local_archive, env, cache_dir())
    started = time.monotonic()
    bar = progress_display(f"sending {archive.name}", archive.stat().st_size)
    await transport.run(["mkdir", "-p", "-m", "700", "--", os.path.dirname(remote)])
    await transport.send_file(str(archive), remote, bar)
    sent, arrived = (
        await asyncio.to_thread(file_sha256, archive),
        await archive_sha256(transport, remote),
    )
    if arrived != sent:
        await transport.run(["rm", "-f", "--", remote], check=False)
        raise SlurmRayError(
            f"the environment pack sent to {transport.target}:{remote} arrived different "
            f"(sha256 {arrived}, sent {sent}); it was removed: run up again"
        )
    _say(f"sent {archive.name} to {transport.target} in {time.monotonic() - started:.1f} s")
    return remote


def bootstrap_command(command: list[str], pack: PackOnCluster) -> list[str]:
    """The job's bootstrap command (``JobDir.bootstrap_command``) with the pack named to it,
    and the content it must have.

    ``env NAME=VALUE`` keeps the names visible in the job script; srun passes them on to the
    workers. The bootstrap itself runs on the nodes' own Python (it needs only the standard
    library); Ray runs from the unpacked environment.
    """
    return [
        "env",
        f"{PACK_VARIABLE}={pack.path}",
        f"{PACK_SHA256_VARIABLE}={pack.sha256}",
        *command,
    ]


def bootstrap_python(spec: ClusterSpec) -> str | None:
    """The Python that runs the bootstrap: ``python`` if set; with a pack, ``python3`` (the
    kernel's own environment is then not needed on the nodes)."""
    if spec.environment == "pack" and spec.python is None:
        return "python3"
    return spec.python


def progress_display(what: str, total: int) -> Progress:
    """The UI's progress bar when it has one (``display.progress``: ipywidgets in a
    notebook), else a line every 10 % on stderr."""
    bar = display.progress(what, total)
    if bar is not None:
        return bar
    shown = [-1]

    def report(done: int, _total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth != shown[0]:
            shown[0] = tenth
            _say(f"{what}: {done / 1e6:.0f} / {total / 1e6:.0f} MB")

    return report
