"""Ray inside a container: the bootstrap stays on the node (it needs srun, scontrol and the port
lock), and only Ray's commands (`ray start`, the version probe, `ray drain-node`) run through
the container runtime. A runtime is one class that turns (image, binds, gpus?, argv) into the
argv to exec; adding a runtime is adding a class to RUNTIMES and its name to
``jsr_wire.CONTAINER_RUNTIMES`` (the container_runtime setting's values).

Both runtimes here share the node's network namespace and PID view, so Ray's addresses, ports
and the process-group cleanup (procgroups.py) work as without a container; the runtime execs
the command, so the process the bootstrap started is `ray start` itself.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from jsr_base import LOG_LINES, BootstrapError, Config, short_hostname
from jsr_wire import CONTAINER_RUNTIMES

GRES_CONF = "gres.conf"
# The version probe inside the image: the Python next to its `ray` (the one Ray's processes run)
_PROBE_SHELL = (
    'ray=$(command -v ray) || { echo "no ray command on the image\'s PATH" >&2; exit 3; }; '
    'py=$(dirname "$ray")/python; [ -x "$py" ] || py=python3; exec "$py" -c "$0"'
)
_PROBE = (
    "import platform, time\nstarted = time.perf_counter()\nimport ray\n"
    "print(ray.__version__, platform.python_version(), time.perf_counter() - started)"
)


class Runtime:
    """A container runtime: its command, and how it runs a command in an image."""

    command: ClassVar[str]

    def __init__(self, executable: str) -> None:
        self.executable = executable

    def argv(
        self, image: str, binds: Sequence[str], gpus: bool, command: Sequence[str]
    ) -> list[str]:
        raise NotImplementedError


class Apptainer(Runtime):
    """`apptainer exec [--nv] --bind P ... IMAGE cmd...`: the image's own PATH, the host's
    other environment (CUDA_VISIBLE_DEVICES included); --nv brings NVIDIA's devices and
    libraries."""

    command = "apptainer"

    def argv(
        self, image: str, binds: Sequence[str], gpus: bool, command: Sequence[str]
    ) -> list[str]:
        flags = ["--nv"] if gpus else []
        for path in binds:
            flags += ["--bind", path]
        return [self.executable, "exec", *flags, image, *command]


class Singularity(Apptainer):
    """SingularityCE: the same command line as Apptainer's."""

    command = "singularity"


class Charliecloud(Runtime):
    """`ch-run --set-env [--home] --bind=P ... IMAGE -- cmd...` (unprivileged, a directory or
    SquashFS image). ch-run shares the host's /tmp and /dev and passes the environment on;
    --set-env adds the image's /ch/environment (its PATH to Ray). It binds only onto
    directories the image has: a path under $HOME=/home/$USER comes with --home."""

    command = "ch-run"

    def argv(
        self, image: str, binds: Sequence[str], gpus: bool, command: Sequence[str]
    ) -> list[str]:
        home = os.environ.get("HOME", "")
        home_bound = home == f"/home/{os.environ.get('USER', '')}" and home != "/home/"
        flags = ["--set-env"]
        if home_bound and any(_inside(path, home) for path in binds):
            flags.append("--home")
        for path in binds:
            if path == "/tmp" or (home_bound and _inside(path, home)):
                continue  # shared already
            flags.append(f"--bind={path}")
        return [self.executable, *flags, image, "--", *command]


# container_runtime's values, in the order 'auto' tries them
RUNTIMES: dict[str, type[Runtime]] = dict(
    zip(CONTAINER_RUNTIMES, (Apptainer, Singularity, Charliecloud), strict=True)
)


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def find_runtime(name: str) -> Runtime:
    """The runtime named by container_runtime ("auto": the first one installed on this node)."""
    names = CONTAINER_RUNTIMES if name == "auto" else (name,)
    if any(item not in RUNTIMES for item in names):
        allowed = ", ".join(["auto", *RUNTIMES])
        raise BootstrapError(f"container_runtime must be one of {allowed}, not {name!r}")
    for item in names:
        path = shutil.which(RUNTIMES[item].command)
        if path:
            return RUNTIMES[item](path)
    commands = " or ".join(f"`{RUNTIMES[item].command}`" for item in names)
    raise BootstrapError(
        f"container_runtime {name}: no {commands} command on {short_hostname()}'s PATH "
        f"({os.environ.get('PATH', '')}); install it there or set container_runtime"
    )


def check_image(image: str) -> None:
    """An image given as a path must exist on this node (URIs like docker://… are the runtime's)."""
    if "://" not in image and not os.path.exists(image):
        raise BootstrapError(f"container: the image {image} does not exist on {short_hostname()}")


def check_bind(path: str) -> str:
    if not path.startswith("/") or re.search(r"[,:\s]", path):
        raise BootstrapError(
            f"container: cannot bind {path!r} into the container (an absolute path without "
            "commas, colons or spaces is needed; move the job-dir root)"
        )
    return path


def gpu_device_dirs(slurm_conf: str | None) -> list[str]:
    """Directories of the GPU device files in the node's gres.conf that are outside /dev (which
    every runtime shares): e.g. a site's or a testbed's own device nodes."""
    conf_dir = Path(slurm_conf).parent if slurm_conf else Path("/etc/slurm")
    try:
        text = (conf_dir / GRES_CONF).read_text()
    except OSError:
        return []
    dirs: list[str] = []
    for match in re.finditer(r"(?i)\bFile=(\S+)", text):
        directory = os.path.dirname(match.group(1))
        if directory.startswith("/") and not _inside(directory, "/dev") and "[" not in directory:
            dirs.append(directory)
    return sorted(set(dirs))


def ray_command_prefix(
    config: Config, job_dir: Path, gpus: bool, env: dict[str, str] | None = None
) -> list[str]:
    """What goes before a Ray command so that it runs in the container: [] without one."""
    if not config.container:
        return []
    env = dict(os.environ) if env is None else env
    runtime = find_runtime(config.container_runtime)
    check_image(config.container)
    binds = [str(job_dir), "/tmp"]
    if gpus:
        binds += [d for d in gpu_device_dirs(env.get("SLURM_CONF")) if os.path.isdir(d)]
    binds = [check_bind(path) for path in binds]
    return runtime.argv(config.container, binds, gpus, [])


def container_versions(
    prefix: list[str], env: dict[str, str]
) -> tuple[str | None, str | None, float | None]:
    """(Ray version, Python version, seconds ``import ray`` took) inside the image; a
    BootstrapError with the runtime's output when Ray does not run there."""
    argv = [*prefix, "sh", "-c", _PROBE_SHELL, _PROBE]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BootstrapError(f"container: the runtime did not run ({exc})") from exc
    words = done.stdout.split()
    if done.returncode == 0 and len(words) == 3:
        return words[0], words[1], round(float(words[2]), 3)
    lines = (done.stdout + done.stderr).splitlines()[-LOG_LINES:]
    raise BootstrapError(
        f"container: Ray does not run in the image (exit {done.returncode} of "
        f"{shlex.join(argv[:4])} ...): the image needs ray[default] on its PATH",
        lines,
    )
