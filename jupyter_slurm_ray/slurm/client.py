"""Slurm's command lines and nothing else: sbatch, squeue, sacct, scancel, sinfo, sacctmgr and
scontrol over a Transport.

While jobs are active, watching any number of them costs ONE ``squeue`` per poll. A job that
has ended is looked up once more (``sacct``, or ``sacct -c`` on clusters without slurmdbd) for
its exit code, and for jobs squeue has already forgotten. Accounting (``sacctmgr``: accounts,
QOSes; ``sacct``: usage) and ``scontrol update`` (the time limit) are asked on request only,
never on the poll path.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CommandError, ExtendRefused, SlurmError, SlurmUnavailable, TransportError
from ..naming import cluster_id_of_comment, cluster_id_of_worker_comment
from ..scheduler.interface import Scheduler
from ..scheduler.kind import EnclosingJob, JobRequest
from ..scheduler.records import Association, JobInfo, Partition, Qos, UsageRow
from ..transport import CommandResult, Transport
from . import options
from .formats import expand_hostlist
from .header import sbatch_header
from .output import (
    ASSOCIATION_FIELDS,
    QOS_FIELDS,
    SACCT_FIELDS,
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    USAGE_FIELDS,
    merge_final,
    parse_associations,
    parse_qos,
    parse_sacct,
    parse_scontrol_job,
    parse_sinfo,
    parse_squeue_line,
    parse_usage,
)

if TYPE_CHECKING:
    from .queuecache import SharedQueue

log = logging.getLogger(__name__)

__all__ = ["LOCAL_MODE_HINT", "SlurmClient", "with_local_mode_hint"]

#: a Slurm job's id: a number, or an array task's (``123_4``)
SLURM_JOB_ID = re.compile(r"\d+(_\d+)?", re.ASCII)

#: what to do where no Slurm answers at all
LOCAL_MODE_HINT = (
    "no Slurm here? local mode runs the cluster as processes of this machine: "
    '`%slurm_ray up --local`, or mode = "local" (SlurmRay.mode, JUPYTER_SLURM_RAY_MODE=local, '
    "or a profile)"
)

# The script comes on stdin: what Slurm keeps is the text that was checked, never a file
# someone could swap by its path. (Constant; "$1", when given, is the path of a script file,
# read through the same stdin.) sbatch lets SBATCH_* variables override the script's #SBATCH
# lines: the transport already runs Slurm commands without an enclosing job's input variables
# (bootstrap/slurmenv.py), and this unsets any that a command prefix (a site's wrapper) set.
# bash -c NAMED_NODE jsr-node ARGV…: ARGV run with its node's name in JSR_NODE
_NAMED_NODE = 'export JSR_NODE="${SLURMD_NODENAME:-$(hostname -s)}"; exec "$@"'
_SBATCH_STDIN = (
    'for v in $(env | sed -n "s/^\\(SBATCH_[A-Za-z0-9_]*\\)=.*/\\1/p"); do unset "$v"; done; '
    '[ $# = 0 ] || exec <"$1"; '
    "exec sbatch --parsable"
)
# The command in "$@", for the user running it: sacctmgr needs the user's name, which only the
# other side knows (runuser, SSH). (Constant; the arguments are the package's own.)
AS_THIS_USER = 'exec "$@" "user=$(id -un)"'


class SlurmClient(Scheduler):
    """Slurm's jobs: submitted, watched and cancelled with Slurm's commands through a Transport.

    Queries either answer for every job asked about, or raise :class:`SlurmUnavailable`: a
    job missing from an answer is one Slurm positively does not know, never one it could not
    be asked about.
    """

    source = "squeue"
    system = "Slurm"
    mode = "slurm"

    def __init__(
        self, transport: Transport, *, timeout: float = 30.0, shared: SharedQueue | None = None
    ) -> None:
        super().__init__(transport, timeout=timeout)
        self.shared = shared  # the user's queue, shared with their other processes on this host

    @classmethod
    def owns(cls, job_id: str) -> bool:
        return SLURM_JOB_ID.fullmatch(job_id) is not None

    @classmethod
    def option_refusal(cls, name: str) -> str | None:
        return options.option_refusal(name)

    @classmethod
    def header(cls, request: JobRequest) -> list[str]:
        return sbatch_header(request)

    @classmethod
    def enclosing(cls, environ: Mapping[str, str]) -> EnclosingJob | None:
        job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
        if not job:
            return None
        count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1"
        return EnclosingJob(job, int(count) if count.isdigit() else 1)

    @classmethod
    def create(
        cls, transport: Transport, *, timeout: float = 30.0, shared: Any = None
    ) -> SlurmClient:
        return cls(transport, timeout=timeout, shared=shared)

    async def answer(self, argv: Sequence[str], *, timeout: float | None = None) -> SlurmAnswer:
        """Run a Slurm command; SlurmUnavailable when it gives no answer at all."""
        self.commands_run += 1
        try:
            result = await self.transport.run(argv, timeout=timeout or self.timeout, check=False)
        except TransportError as exc:
            raise SlurmUnavailable(f"{argv[0]}: {exc}") from None
        if result.returncode == 127 or (result.returncode != 0 and _no_controller(result.stderr)):
            raise SlurmUnavailable(f"{argv[0]}: {_first_line(result.stderr)}")
        return SlurmAnswer(result.returncode, result.stdout, result.stderr)

    async def output(self, argv: Sequence[str], *, as_user: bool = False) -> str:
        """stdout of a Slurm command that must succeed; SlurmError in Slurm's words if not.

        ``as_user``: ``user=<the name of whoever runs it>`` is added to the arguments.
        """
        command = ["sh", "-c", AS_THIS_USER, argv[0], *argv] if as_user else list(argv)
        answer = await self.answer(command)
        if answer.returncode != 0:
            exc = CommandError(list(argv), answer.returncode, answer.stdout, answer.stderr)
            raise SlurmError(_slurm_message(exc))
        return answer.stdout

    def unreachable(self, silence: SlurmUnavailable) -> SlurmUnavailable:
        return with_local_mode_hint(silence)

    # -- submit / cancel --------------------------------------------------------------------
    async def submit(self, script: str, *, timeout: float = 60.0) -> str:
        """Submit a job script; return the job id.

        ``script`` is the script's text (it starts with ``#!``, as sbatch requires), given to
        sbatch on its stdin: the job is exactly this text, whatever happens to the copy the
        caller keeps in the job dir. Anything else is taken as the path of a script file,
        read as sbatch's stdin in the same command.

        A TransportError (timeout, connection lost) means the outcome is unknown: the job may
        exist. Callers look it up by its tag (:meth:`find_tagged`) before giving up.
        """
        self.commands_run += 1
        text, path = (script, None) if is_script_text(script) else (None, script)
        argv = ["sh", "-c", _SBATCH_STDIN, "sbatch", *([path] if path else [])]
        shown = path or "the job script (stdin)"
        try:
            result = await self.transport.run(argv, input=text, timeout=timeout)
        except CommandError as error:
            # named for sbatch, not for the sh that runs it (the words are sbatch's)
            exc = CommandError(["sbatch", shown], error.returncode, error.stdout, error.stderr)
            if exc.returncode == 127:  # no sbatch on this machine: nothing was queued
                missing = f"sbatch is not installed here: {_first_line(exc.stderr)}"
                raise SlurmUnavailable(missing) from None
            if _no_controller(exc.stderr):  # sbatch gave up: nothing was queued
                raise SlurmUnavailable(_slurm_message(exc)) from None
            raise SlurmError(_slurm_message(exc)) from None
        out = result.stdout
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r} instead of a job id")
        log.info("submitted job %s (%s)", job_id, shown)
        return job_id

    async def cancel(
        self, job_id: str, *, signal: str | None = None, batch_only: bool = False
    ) -> None:
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
        if batch_only:
            argv.append("--batch")
        argv.append(_job_id(job_id))
        await self.output(argv)

    # -- watching ---------------------------------------------------------------------------
    async def query(self, job_ids: Iterable[str], *, max_age: float = 0.0) -> dict[str, JobInfo]:
        """State of every job in ``job_ids``: one squeue call, plus accounting for ended jobs.

        With a shared queue, squeue's answer may be one another process of this user asked
        at most ``max_age`` seconds ago. Jobs missing from the result are unknown to Slurm (it
        said so); SlurmUnavailable when Slurm could not be asked.
        """
        ids = sorted({_job_id(j) for j in job_ids}, key=int)
        if not ids:
            return {}
        shown = await self._squeue(ids, max_age)
        infos: dict[str, JobInfo | None] = dict(shown)
        ended = [j for j in ids if infos.get(j) is None or infos[j].is_final]  # type: ignore[union-attr]
        if ended:
            # A job a fresh `squeue -t all` does not show is one slurmctld no longer knows:
            # asking it again, one scontrol per job, only repeats that (gc over a thousand
            # old job dirs spent 14 s so). An answer from the shared queue may predate a job.
            fresh = self.shared is None or max_age <= 0
            remembered = [j for j in ended if j in shown] if fresh else None
            history = await self.history(ended, remembered=remembered)
            for job_id in ended:
                infos[job_id] = merge_final(infos.get(job_id), history.get(job_id))
        return {j: info for j in ids if (info := infos.get(j)) is not None}

    async def _squeue(self, ids: list[str], max_age: float = 0.0) -> dict[str, JobInfo]:
        if self.shared is not None:
            output = await self.shared.output(max_age, self._squeue_mine)
            wanted = set(ids)
            return {j: info for j, info in _parse_queue(output).items() if j in wanted}
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT]
        answer = await self.answer(argv)
        # squeue exits 1 ("Invalid job id specified") when none of the ids is known any more.
        if answer.returncode != 0 and not _invalid_job_id(answer.stderr):
            raise SlurmUnavailable(f"squeue: {_first_line(answer.stderr) or 'failed'}")
        return _parse_queue(answer.stdout)

    async def _squeue_mine(self) -> str:
        """Every job of this user that Slurm shows (running, queued, recently ended)."""
        answer = await self.answer(["squeue", "-h", "--me", "-t", "all", "-o", SQUEUE_FORMAT])
        if answer.returncode != 0:
            raise SlurmUnavailable(f"squeue: {_first_line(answer.stderr) or 'failed'}")
        return answer.stdout

    async def history(
        self, job_ids: Sequence[str], *, remembered: Sequence[str] | None = None
    ) -> dict[str, JobInfo]:
        """Final state and exit code from accounting (slurmdbd) or, failing that, jobcomp;
        then from slurmctld itself, which remembers ended jobs for MinJobAge (only about the
        jobs in ``remembered``, when given: those it is known to remember)."""
        wanted = [_job_id(j) for j in job_ids]
        found: dict[str, JobInfo] = {}
        for extra in ([], ["-c"]):
            missing = [j for j in wanted if j not in found]
            if not missing:
                break
            argv = ["sacct", *extra, "-X", "-n", "-P", "-j", ",".join(missing)]
            try:
                answer = await self.answer([*argv, "-o", SACCT_FIELDS])
            except SlurmUnavailable:
                continue  # accounting is optional; slurmctld is asked below
            if answer.returncode == 0:
                parsed = parse_sacct(answer.stdout)
                found.update({j: parsed[j] for j in missing if j in parsed})
        missing = [j for j in wanted if j not in found]
        if remembered is not None:
            missing = [j for j in missing if j in remembered]
        if missing:
            found.update(await self._scontrol_history(missing))
        return found

    async def _scontrol_history(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        infos = {}
        for job_id in job_ids:
            answer = await self.answer(["scontrol", "show", "job", "-o", _job_id(job_id)])
            if answer.returncode == 0:
                info = parse_scontrol_job(answer.stdout)
                if info is not None:
                    infos[info.job_id] = info
            elif not _invalid_job_id(answer.stderr):
                raise SlurmUnavailable(f"scontrol: {_first_line(answer.stderr) or 'failed'}")
        return infos

    async def partitions(self) -> list[Partition]:
        out = await self.output(["sinfo", "-h", "-o", SINFO_FORMAT])
        return parse_sinfo(out)

    async def memory_settings(self) -> tuple[str, str]:
        """``scontrol show config`` and ``scontrol show partition -o`` (memory: whether it is
        enforced, the defaults): memorypolicy.py reads them."""
        config = await self.output(["scontrol", "show", "config"])
        partitions = await self.output(["scontrol", "show", "partition", "-o"])
        return config, partitions

    # -- accounting and the time limit (on request, never on the poll path) -------------------
    async def associations(self) -> list[Association]:
        """The user's associations (accounts, QOSes, limits) and default account: one
        ``sacctmgr``. SlurmError when accounting cannot be asked (e.g. no slurmdbd)."""
        argv = ["sacctmgr", "-n", "-P", "show", "user", "withassoc"]
        out = await self.output([*argv, f"format={ASSOCIATION_FIELDS}", "where"], as_user=True)
        return parse_associations(out)

    async def qos(self) -> dict[str, Qos]:
        """Every QOS and its per-job limits: one ``sacctmgr``."""
        out = await self.output(["sacctmgr", "-n", "-P", "show", "qos", f"format={QOS_FIELDS}"])
        return parse_qos(out)

    async def usage(self, job_ids: Sequence[str]) -> list[UsageRow]:
        """What the jobs used, allocations and steps (``sacct``, sizes in bytes): one call.
        SlurmError when there is no accounting."""
        ids = ",".join(_job_id(j) for j in job_ids)
        argv = ["sacct", "-n", "-P", "--noconvert", "-j", ids, "-o", USAGE_FIELDS]
        return parse_usage(await self.output(argv))

    async def extend(self, job_id: str, minutes: int) -> None:
        """Add ``minutes`` to the job's time limit (``scontrol update``); ExtendRefused with
        Slurm's words when it refuses (users often may not raise their own limit)."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
            raise SlurmError(f"not a number of minutes to add: {minutes!r}")
        argv = ["scontrol", "update", f"JobId={_job_id(job_id)}", f"TimeLimit=+{minutes}"]
        answer = await self.answer(argv)
        if answer.returncode != 0:
            exc = CommandError(argv, answer.returncode, answer.stdout, answer.stderr)
            raise ExtendRefused(_slurm_message(exc))

    node_runner = "srun"

    async def run_on_nodes(
        self,
        job_id: str,
        argv: Sequence[str],
        *,
        nodes: int,
        hosts: str | None = None,
        timeout: float = 30.0,
    ) -> CommandResult:
        """One ``srun --overlap`` step in the job's allocation, a task per node."""
        where = [f"--nodelist={hosts}"] if hosts else []
        step = [
            "srun", f"--jobid={_job_id(job_id)}", "--overlap", f"--nodes={nodes}",
            f"--ntasks={nodes}", *where, "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            "bash", "-c", _NAMED_NODE, "jsr-node", *argv,
        ]  # fmt: skip
        self.commands_run += 1
        try:
            return await self.transport.run(step, timeout=timeout, check=False)
        except TransportError as exc:
            raise SlurmUnavailable(f"srun: {exc}") from None

    async def node_reasons(self, nodes: Sequence[str]) -> dict[str, str]:
        """Slurm's reason for each of ``nodes`` that is down, drained or failing."""
        if not nodes:
            return {}
        argv = ["sinfo", "-h", "-N", "-R", "-n", ",".join(nodes), "-o", "%N|%E"]
        reasons: dict[str, str] = {}
        for line in (await self.output(argv)).splitlines():
            node, _, reason = line.partition("|")
            for host in expand_hostlist(node):
                reasons.setdefault(host, reason.strip())
        return reasons

    async def tagged_jobs(self) -> dict[str, str]:
        """This user's active jobs that carry a cluster tag: job id -> cluster id."""
        return await self._jobs_tagged_by(cluster_id_of_comment)

    async def tagged_worker_jobs(self) -> dict[str, str]:
        """This user's active worker jobs: job id -> the cluster id of their tag."""
        return await self._jobs_tagged_by(cluster_id_of_worker_comment)

    async def _jobs_tagged_by(self, cluster_id_of: Callable[[str], str | None]) -> dict[str, str]:
        """This user's active jobs whose comment ``cluster_id_of`` reads a cluster id from
        (one squeue): job id -> cluster id."""
        out = await self.output(["squeue", "-h", "--me", "-o", "%i|%k"])
        found = {}
        for line in out.splitlines():
            job_id, _, comment = line.partition("|")
            cluster_id = cluster_id_of(comment)
            if cluster_id is not None and job_id.strip().isdigit():
                found[job_id.strip()] = cluster_id
        return found

    async def work_dirs(self) -> dict[str, str]:
        """This user's active jobs' working directories (``--chdir``: a cluster's job dir,
        whichever machine submitted it), one squeue: job id -> directory."""
        out = await self.output(["squeue", "-h", "--me", "-o", "%i|%Z"])
        found = {}
        for line in out.splitlines():
            job_id, _, directory = line.partition("|")
            if job_id.strip().isdigit() and directory.startswith("/"):
                found[job_id.strip()] = directory.strip()
        return found

    async def find_tagged(self, cluster_id: str) -> str | None:
        """The job id of the active job tagged for ``cluster_id`` (the newest), or None."""
        jobs = [j for j, c in (await self.tagged_jobs()).items() if c == cluster_id]
        return max(jobs, key=int) if jobs else None


def with_local_mode_hint(exc: SlurmUnavailable) -> SlurmUnavailable:
    """The same silence, its message ending with how to run without Slurm."""
    return SlurmUnavailable(f"{exc}; {LOCAL_MODE_HINT}")


def is_script_text(script: str) -> bool:
    """A job script's text rather than a path: it starts with ``#!`` (sbatch's own rule)."""
    return script.startswith("#!")


def _parse_queue(output: str) -> dict[str, JobInfo]:
    infos = (parse_squeue_line(line) for line in output.splitlines() if line.strip())
    return {info.job_id: info for info in infos if info is not None}


@dataclass(frozen=True)
class SlurmAnswer:
    """A Slurm command's exit status and output (``SlurmClient.answer``)."""

    returncode: int
    stdout: str
    stderr: str


# How Slurm's clients say that the controller did not answer (22.05 .. 24.x).
_NO_CONTROLLER = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "slurm_load_jobs error: slurm backup controller in standby mode",
    "communication connection failure",
    "zero bytes were transmitted or received",
    "rpc rate limit exceeded",
    "transport endpoint is not connected",
)


def _no_controller(stderr: str) -> bool:
    text = stderr.lower()
    return any(marker in text for marker in _NO_CONTROLLER)


def _invalid_job_id(stderr: str) -> bool:
    return "invalid job id" in stderr.lower()


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _job_id(job_id: str | int) -> str:
    text = str(job_id).strip()
    if not SLURM_JOB_ID.fullmatch(text):
        raise SlurmError(f"not a Slurm job id: {job_id!r} (expected digits, e.g. 1234)")
    return text


def _slurm_message(exc: CommandError) -> str:
    """Slurm's own words, without the ``sbatch: error:`` prefixes."""
    lines = [
        re.sub(r"^\w+: error: ", "", line).strip()
        for line in (exc.stderr or exc.stdout).splitlines()
        if line.strip()
    ]
    message = "; ".join(lines) or f"exit status {exc.returncode}"
    return f"{exc.argv[0]} failed: {message}"


async def run_program(transport: Transport, argv: list[str], what: str, timeout: float) -> str:
    """The output of a scheduler's own shell program (``argv``); its failure as Slurm's,
    named by ``what`` (``local mode``, ``--here``)."""
    try:
        result = await transport.run(argv, timeout=timeout)
    except CommandError as exc:
        raise SlurmError(f"{what}: {exc.stderr.strip() or exc}") from None
    except TransportError as exc:
        raise SlurmUnavailable(f"{what}: {exc}") from None
    return result.stdout


def script_options(script: str) -> dict[str, str]:
    """A job script's ``#SBATCH`` long options as sbatch reads them (the last of each wins; a
    flag's value is "")."""
    options: dict[str, str] = {}
    for line in script.splitlines():
        if not line.startswith("#SBATCH "):
            continue
        for word in shlex.split(line[len("#SBATCH ") :]):
            name, _, value = word.partition("=")
            options[name] = value
    return options
