"""Local mode's scheduler: the cluster's job script run as processes of this machine.

``LocalJobs`` is a :class:`~..scheduler.interface.Scheduler`, beside Slurm's: ``cluster.py``,
the watcher, the inventory and the server only pick the scheduler by the cluster's mode or a
job's id (``schedulers.py``). The same job script and bootstrap run, one node:

- ``submit`` takes the script's text, as sbatch on its stdin, reads its ``#SBATCH`` lines (job
  dir, walltime, CPUs, memory, the warning signal, the ``--export`` list: the job gets only
  those variables, as from sbatch) as sbatch would, keeps the text in the state dir (as
  slurmctld keeps a job's script: the job runs that copy, not the job dir's ``job.sbatch``)
  and starts a *runner* (a constant Python program, below, run by this kernel's interpreter)
  in a new session: the job id is ``local-<runner pid>``. The runner
  sets the ``SLURM_*`` variables the bootstrap reads (one node, this host) and
  ``JSR_LOCAL_MODE=1`` (then the bootstrap asks no ``scontrol``; one node needs no ``srun``),
  writes the job's output to ``slurm-<job>.out/.err`` in the job dir, sends SIGUSR1 at the
  walltime warning and ends the job at its walltime (TIMEOUT), with a grace before SIGKILL.
- ``query`` reads each job's files in the user's ``~/.jupyter-slurm-ray/local-jobs``: the
  runner's identity (its start time, against PID reuse) and, once it ended, its final state
  and exit status; a runner that vanished without one is FAILED.
- ``cancel`` is scancel's SIGTERM to the job's process group; the runner passes it on to the
  bootstrap (which stops its Ray processes) and kills it after a grace, like Slurm's KillWait.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType

from ..bootstrap.jsr_wire import LOCAL_MODE_VARIABLE
from ..errors import CommandError, ExtendRefused, SlurmError
from ..scheduler.interface import Scheduler
from ..scheduler.kind import JobRequest
from ..scheduler.records import JobInfo
from ..spec.checks import parse_walltime
from .client import is_script_text, run_program, script_options
from .header import sbatch_header
from .options import option_refusal

log = logging.getLogger(__name__)

__all__ = [
    "LocalJobs",
    "is_local_job_id",
    "job_limits",
]

KILL_GRACE = 30  # seconds between the cancel's SIGTERM and SIGKILL (Slurm's KillWait default)
STATE_DIR = "$HOME/.jupyter-slurm-ray/local-jobs"  # expanded by the shell of the job's user

# The runner (Python, stdlib only, run by this kernel's interpreter, as local mode's bootstrap
# is): argv job dir, state dir, launch tag, walltime (s, 0 none), warning (s before the end),
# CPUs ("" = this machine's), memory (MB, "" = unset), grace (s), the --export list (ALL,
# NONE or names). A Python runner, not bash: bash loses the status of a child that ends while
# a trap runs. Like slurmstepd, it sets the user's HOME, USER, LOGNAME and SHELL if not given.
_RUNNER = r"""
import os, pwd, signal, socket, subprocess, sys, time
job_dir, state_dir, tag, limit, warn, cpus, mem, grace, export = sys.argv[1:10]
limit, warn, grace = int(limit), int(warn), int(grace)
job_id, host = f"local-{os.getpid()}", socket.gethostname().split(".")[0]
def write(name, text):
    path = os.path.join(state_dir, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)
try:  # an earlier job of this pid (pids wrap) left its exit status: not this job's
    os.unlink(os.path.join(state_dir, job_id + ".exit"))
except FileNotFoundError:
    pass
ps = ["ps", "-o", "lstart=", "-p", str(os.getpid())]
lstart = subprocess.run(ps, capture_output=True, text=True).stdout.strip()
write(job_id + ".start", f"{lstart}\n{int(time.time())} {limit} {host}\n")
script = os.path.join(state_dir, job_id + ".sbatch")
os.replace(os.path.join(state_dir, "script-" + tag), script)
write("launch-" + tag, str(os.getpid()))
os.chdir(job_dir)
cpus = cpus or str(os.cpu_count() or 1)
if export == "ALL":
    given = dict(os.environ)
else:
    names = [] if export == "NONE" else export.split(",")
    given = {name: os.environ[name] for name in names if name in os.environ}
    user = pwd.getpwuid(os.getuid())
    for name, value in (("HOME", user.pw_dir), ("USER", user.pw_name),
                        ("LOGNAME", user.pw_name), ("SHELL", user.pw_shell or "/bin/sh"),
                        ("PATH", "/usr/bin:/bin")):
        given.setdefault(name, value)
env = dict(given, SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NUM_NODES="1",
           SLURM_NNODES="1", SLURM_NTASKS="1", SLURM_NODEID="0", SLURM_PROCID="0",
           SLURM_LOCALID="0", SLURM_CPUS_ON_NODE=cpus, SLURM_JOB_CPUS_PER_NODE=cpus,
           SLURM_SUBMIT_DIR=job_dir, SLURMD_NODENAME=host, SLURM_JOB_NODELIST=host,
           SLURM_NODELIST=host, SLURM_CLUSTER_NAME="local-mode", __LOCAL_MODE__="1")
if mem:
    env["SLURM_MEM_PER_NODE"] = mem
state, kill_at, warned, begun, job = None, None, False, time.monotonic(), None
def stop(why):
    global state, kill_at
    state = state or why
    kill_at = kill_at or time.monotonic() + grace
    if job is not None:
        job.send_signal(signal.SIGTERM)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, lambda *_: stop("CANCELLED"))
with open(f"slurm-{job_id}.out", "ab") as out, open(f"slurm-{job_id}.err", "ab") as err:
    job = subprocess.Popen(["bash", script], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                           env=env)
if state is not None:  # cancelled while it started
    stop(state)
while job.poll() is None:
    now = time.monotonic() - begun
    if limit and not warned and now >= limit - warn:
        warned = True
        job.send_signal(signal.SIGUSR1)
    if limit and now >= limit and state is None:
        stop("TIMEOUT")
    if kill_at is not None and time.monotonic() >= kill_at:
        job.kill()
    try:
        job.wait(0.25)
    except subprocess.TimeoutExpired:
        pass
code = job.returncode if job.returncode >= 0 else 128 - job.returncode
write(job_id + ".exit", f"{state or ('COMPLETED' if code == 0 else 'FAILED')} {code} "
      f"{int(time.time())}\n")
os.unlink(script)
""".replace("__LOCAL_MODE__", LOCAL_MODE_VARIABLE)

# The launcher: keeps the job script from its stdin in the state dir, starts the runner in a
# new session, waits for its pid, prints it. $0 the runner, $1 its Python, $2 the job dir,
# $3.. the runner's arguments from the walltime on.
_LAUNCH = r"""
umask 077
d=__STATE__; mkdir -p -- "$d" && chmod 700 -- "$d" || exit 1
find "$d" -maxdepth 1 -type f -mtime +30 -delete 2>/dev/null
tag=$$.$(date +%s%N)
cat >"$d/script-$tag" || exit 1
setsid "$1" -c "$0" "$2" "$d" "$tag" "$3" "$4" "$5" "$6" "$7" "$8" \
  </dev/null >/dev/null 2>&1 &
i=0
while [ ! -e "$d/launch-$tag" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
cat -- "$d/launch-$tag" && rm -f -- "$d/launch-$tag"
""".replace("__STATE__", STATE_DIR)

# Each job's files and whether its runner is the same process: "id|lstart now|start|exit".
_QUERY = r"""
d=__STATE__
for id in "$@"; do
  pid=${id#local-}
  [ -e "$d/$id.start" ] || continue
  now=$(ps -o lstart= -p "$pid" 2>/dev/null)
  start=$(tr '\n' '|' <"$d/$id.start")
  ex=$(cat -- "$d/$id.exit" 2>/dev/null)
  printf '%s|%s|%s%s\n' "$id" "$now" "$start" "$ex"
done
""".replace("__STATE__", STATE_DIR)

# SIGTERM to the job's process group, if its runner is still the same process (an exit
# status there may be an earlier job's of the same pid).
_CANCEL = r"""
d=__STATE__ pid=${1#local-}
[ "$(ps -o lstart= -p "$pid" 2>/dev/null)" = "$(head -n 1 "$d/$1.start" 2>/dev/null)" ] || exit 0
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
""".replace("__STATE__", STATE_DIR)


def is_local_job_id(job_id: str) -> bool:
    """``local-<pid>``: the id of a local-mode job."""
    return job_id.startswith("local-") and job_id[len("local-") :].isdigit()


def job_limits(script: str) -> dict[str, str]:
    """What the runner needs from a job script's ``#SBATCH`` lines, as sbatch reads them:
    walltime and warning seconds, CPUs, memory in MB (each "" or "0" when unset), the job's
    working directory (``chdir``, "" when unset) and the ``--export`` list (ALL when unset, as
    sbatch's default)."""
    options = script_options(script)
    warning = options.get("--signal", "").partition("@")[2]
    mem = options.get("--mem", "").rstrip("M")
    return {
        "limit": str(parse_walltime(options["--time"])) if options.get("--time") else "0",
        "warning": warning if warning.isdigit() else "0",
        "cpus": options.get("--cpus-per-task", ""),
        "mem": mem if mem.isdigit() else "",
        "chdir": options.get("--chdir", ""),
        "export": options.get("--export") or "ALL",
    }


class LocalJobs(Scheduler):
    """Jobs as process groups of this machine, answered as Slurm's are (one node each)."""

    source = "local"
    system = "local mode"
    mode = "local"
    on_this_machine = True
    decided = MappingProxyType({"nodes": "local mode runs one node"})

    @classmethod
    def option_refusal(cls, name: str) -> str | None:
        return option_refusal(name)  # its job script is Slurm's, read as sbatch would

    @classmethod
    def header(cls, request: JobRequest) -> list[str]:
        return sbatch_header(request)  # the runner reads the limits of its #SBATCH lines

    @classmethod
    def refusal(cls, name: str, value: object, settings: Mapping[str, object]) -> str | None:
        return None if value == 1 else "1 in local mode (Ray runs as one node here)"

    @classmethod
    def owns(cls, job_id: str) -> bool:
        return is_local_job_id(job_id)

    @classmethod
    def fixed_size(cls, least: int) -> str | None:
        return "1 in local mode (scaling adds Slurm worker jobs)"

    @classmethod
    def no_usage(cls, job_ids: Sequence[str]) -> str:
        return "local mode has no Slurm accounting"

    async def _sh(self, program: str, *args: str, timeout: float | None = None) -> str:
        self.commands_run += 1
        argv = ["bash", "-c", program, "jsr-local", *args]
        return await run_program(self.transport, argv, "local mode", timeout or self.timeout)

    # -- submit / cancel --------------------------------------------------------------------
    async def submit(self, script: str, *, timeout: float = 60.0) -> str:
        """Start the job script (its text; or a path, read first) as a local job: its id.
        The job runs in the script's ``--chdir`` (else the directory of its path)."""
        path = None if is_script_text(script) else script
        if path is not None:
            script = await self._sh('cat -- "$1"', path)
        limits = job_limits(script)
        job_dir = limits["chdir"] or (path.rsplit("/", 1)[0] if path else "")
        if not job_dir.startswith("/"):
            raise SlurmError("local mode: the job script has no #SBATCH --chdir (its job dir)")
        args = [limits["limit"], limits["warning"], limits["cpus"], limits["mem"], str(KILL_GRACE)]
        args.append(limits["export"])
        self.commands_run += 1
        argv = ["bash", "-c", _LAUNCH, _RUNNER, sys.executable, job_dir, *args]
        try:
            result = await self.transport.run(argv, input=script, timeout=timeout)
        except CommandError as exc:
            raise SlurmError(f"local mode could not start the job: {exc.stderr.strip()}") from None
        pid = result.stdout.strip()
        if not pid.isdigit():
            raise SlurmError(f"local mode: the job did not start (runner said {pid!r})")
        log.info("started local job local-%s (%s)", pid, job_dir)
        return f"local-{pid}"

    async def cancel(
        self, job_id: str, *, signal: str | None = None, batch_only: bool = False
    ) -> None:
        if signal is not None:
            raise SlurmError(f"local mode sends only scancel's SIGTERM, not {signal}")
        await self._sh(_CANCEL, _local_id(job_id))

    # -- watching ---------------------------------------------------------------------------
    async def query(self, job_ids: Iterable[str], *, max_age: float = 0.0) -> dict[str, JobInfo]:
        ids = sorted({_local_id(j) for j in job_ids})
        if not ids:
            return {}
        out = await self._sh(_QUERY, *ids)
        infos = (parse_local_line(line) for line in out.splitlines() if line.strip())
        return {info.job_id: info for info in infos if info is not None}

    # Local jobs carry no Slurm comment (their records are their only trace), there are no
    # partitions, node reasons nor accounting: the interface's answers.

    async def extend(self, job_id: str, minutes: int) -> None:
        raise ExtendRefused(
            "local mode cannot extend a running cluster's walltime; start a new one with a "
            "longer time"
        )


def parse_local_line(line: str) -> JobInfo | None:
    """One line of the query: ``id|lstart now|lstart at start|epoch limit host|exit``."""
    parts = line.split("|")
    if len(parts) < 4 or not is_local_job_id(parts[0]):
        return None
    job_id, now, started, launch = parts[0], parts[1].strip(), parts[2].strip(), parts[3].split()
    final = parts[4].split() if len(parts) > 4 else []
    epoch = float(launch[0]) if launch and launch[0].isdigit() else None
    limit = int(launch[1]) if len(launch) > 1 and launch[1].isdigit() else 0
    host = tuple(launch[2:3])
    start = datetime.fromtimestamp(epoch) if epoch is not None else None

    def info(state: str, **more: object) -> JobInfo:
        return JobInfo(
            job_id,
            state,
            nodes=host,
            node_count=1,
            start_time=start,
            time_limit=limit or None,
            source="local",
            **more,  # type: ignore[arg-type]
        )

    if len(final) >= 2 and final[1].lstrip("-").isdigit() and not _older(final, epoch):
        return info(final[0], exit_code=int(final[1]))
    if now and now == started:
        left = max(0, int(epoch + limit - time.time())) if limit and epoch is not None else None
        return info("RUNNING", time_left=left)
    return info("FAILED", reason="its runner ended without an exit status (killed, or restarted)")


def _older(final: list[str], started: float | None) -> bool:
    """Whether an exit status (``state code epoch``) was written before the job started: an
    earlier job's of the same pid (pids wrap), left when its runner could not remove it."""
    ended = final[2] if len(final) > 2 else ""
    return started is not None and ended.isdigit() and int(ended) < started


def _local_id(job_id: str | int) -> str:
    text = str(job_id).strip()
    if not is_local_job_id(text):
        raise SlurmError(f"not a local-mode job id: {job_id!r} (expected local-<pid>)")
    return text
