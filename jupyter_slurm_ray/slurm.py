"""Slurm's command lines and nothing else: sbatch, squeue, sacct, scancel, sinfo over a Transport.

While jobs are active, watching any number of them costs ONE ``squeue`` per poll. A job that
has ended is looked up once more (``sacct``, or ``sacct -c`` on clusters without slurmdbd) for
its exit code, and for jobs squeue has already forgotten.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .errors import CommandError, SlurmError, SlurmUnavailable, TransportError
from .naming import cluster_id_of_comment
from .transport import Transport

log = logging.getLogger(__name__)

#: States after which a job never runs again.
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)

# sbatch lets SBATCH_* variables of the submitting environment override the script's #SBATCH
# lines; without them the job is exactly what ``script()`` shows. (Constant; path is "$1".)
_SBATCH_CLEAN_ENV = (
    'for v in $(env | sed -n "s/^\\(SBATCH_[A-Za-z0-9_]*\\)=.*/\\1/p"); do unset "$v"; done; '
    'exec sbatch --parsable "$1"'
)

_SQUEUE_FIELDS = ("%i", "%T", "%D", "%S", "%L", "%l", "%N", "%j", "%k", "%r")
_SQUEUE_FORMAT = "|".join(_SQUEUE_FIELDS)
_SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Start,Timelimit,JobName"


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job at one moment."""

    job_id: str
    state: str
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    start_time: datetime | None = None  # actual, or Slurm's estimate while PENDING
    time_left: int | None = None  # seconds; None when unknown or unlimited
    time_limit: int | None = None
    name: str = ""
    exit_code: int | None = None
    source: str = "squeue"
    comment: str = ""

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def is_running(self) -> bool:
        return self.state in {"RUNNING", "CONFIGURING", "COMPLETING"}


@dataclass(frozen=True)
class Partition:
    """One partition as the widget's dropdown shows it."""

    name: str
    available: bool
    idle_nodes: int
    total_nodes: int
    cpus_per_node: int
    memory_mb: int
    gres: tuple[str, ...] = ()
    max_time: int | None = None  # seconds; None = unlimited
    is_default: bool = False
    gpus_per_node: int = field(default=0)


class SlurmClient:
    """Submits, watches and cancels jobs through a Transport.

    Queries either answer for every job asked about, or raise :class:`SlurmUnavailable`: a
    job missing from an answer is one Slurm positively does not know, never one it could not
    be asked about.
    """

    def __init__(self, transport: Transport, *, timeout: float = 30.0) -> None:
        self.transport = transport
        self.timeout = timeout
        self.commands_run = 0  # count of Slurm commands, so tests can hold us to "one per poll"

    async def _run(self, argv: Sequence[str], *, timeout: float | None = None) -> _Answer:
        """Run a Slurm command; SlurmUnavailable when it gives no answer at all."""
        self.commands_run += 1
        try:
            result = await self.transport.run(argv, timeout=timeout or self.timeout, check=False)
        except TransportError as exc:
            raise SlurmUnavailable(f"{argv[0]}: {exc}") from None
        if result.returncode != 0 and _no_controller(result.stderr):
            raise SlurmUnavailable(f"{argv[0]}: {_first_line(result.stderr)}")
        return _Answer(result.returncode, result.stdout, result.stderr)

    async def _slurm(self, argv: Sequence[str]) -> str:
        """stdout of a Slurm command that must succeed; SlurmError in Slurm's words if not."""
        answer = await self._run(argv)
        if answer.returncode != 0:
            exc = CommandError(list(argv), answer.returncode, answer.stdout, answer.stderr)
            raise SlurmError(_slurm_message(exc))
        return answer.stdout

    # -- submit / cancel --------------------------------------------------------------------
    async def submit(self, script_path: str, *, timeout: float = 60.0) -> str:
        """Submit the job script at ``script_path``; return the job id.

        A TransportError (timeout, connection lost) means the outcome is unknown: the job may
        exist. Callers look it up by its tag (:meth:`find_tagged`) before giving up.
        """
        self.commands_run += 1
        argv = ["sh", "-c", _SBATCH_CLEAN_ENV, "sbatch", script_path]
        try:
            result = await self.transport.run(argv, timeout=timeout)
        except CommandError as exc:
            raise SlurmError(_slurm_message(exc)) from None
        out = result.stdout
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r} instead of a job id")
        log.info("submitted job %s (%s)", job_id, script_path)
        return job_id

    async def cancel(self, job_id: str, *, signal: str | None = None, batch_only: bool = False):
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
        if batch_only:
            argv.append("--batch")
        argv.append(_job_id(job_id))
        await self._slurm(argv)

    # -- watching ---------------------------------------------------------------------------
    async def query(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """State of every job in ``job_ids``: one squeue call, plus accounting for ended jobs.

        Jobs missing from the result are unknown to Slurm (it said so); SlurmUnavailable when
        Slurm could not be asked.
        """
        ids = sorted({_job_id(j) for j in job_ids}, key=int)
        if not ids:
            return {}
        infos = await self._squeue(ids)
        ended = [j for j in ids if j not in infos or infos[j].is_final]
        if ended:
            history = await self.history(ended)
            for job_id in ended:
                infos[job_id] = _merge_final(infos.get(job_id), history.get(job_id))
        return {j: infos[j] for j in ids if infos.get(j) is not None}

    async def _squeue(self, ids: list[str]) -> dict[str, JobInfo]:
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", _SQUEUE_FORMAT]
        answer = await self._run(argv)
        # squeue exits 1 ("Invalid job id specified") when none of the ids is known any more.
        if answer.returncode != 0 and not _invalid_job_id(answer.stderr):
            raise SlurmUnavailable(f"squeue: {_first_line(answer.stderr) or 'failed'}")
        infos = (parse_squeue_line(line) for line in answer.stdout.splitlines() if line.strip())
        return {info.job_id: info for info in infos if info is not None}

    async def history(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """Final state and exit code from accounting (slurmdbd) or, failing that, jobcomp;
        then from slurmctld itself, which remembers ended jobs for MinJobAge."""
        wanted = [_job_id(j) for j in job_ids]
        found: dict[str, JobInfo] = {}
        for extra in ([], ["-c"]):
            missing = [j for j in wanted if j not in found]
            if not missing:
                break
            argv = ["sacct", *extra, "-X", "-n", "-P", "-j", ",".join(missing)]
            try:
                answer = await self._run([*argv, "-o", _SACCT_FIELDS])
            except SlurmUnavailable:
                continue  # accounting is optional; slurmctld is asked below
            if answer.returncode == 0:
                parsed = parse_sacct(answer.stdout)
                found.update({j: parsed[j] for j in missing if j in parsed})
        missing = [j for j in wanted if j not in found]
        if missing:
            found.update(await self._scontrol_history(missing))
        return found

    async def _scontrol_history(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        infos = {}
        for job_id in job_ids:
            answer = await self._run(["scontrol", "show", "job", "-o", _job_id(job_id)])
            if answer.returncode == 0:
                info = parse_scontrol_job(answer.stdout)
                if info is not None:
                    infos[info.job_id] = info
            elif not _invalid_job_id(answer.stderr):
                raise SlurmUnavailable(f"scontrol: {_first_line(answer.stderr) or 'failed'}")
        return infos

    async def partitions(self) -> list[Partition]:
        out = await self._slurm(["sinfo", "-h", "-o", "%R|%a|%F|%c|%m|%G|%l|%P"])
        return parse_sinfo(out)

    async def node_reasons(self, nodes: Sequence[str]) -> dict[str, str]:
        """Slurm's reason for each of ``nodes`` that is down, drained or failing."""
        if not nodes:
            return {}
        argv = ["sinfo", "-h", "-N", "-R", "-n", ",".join(nodes), "-o", "%N|%E"]
        reasons: dict[str, str] = {}
        for line in (await self._slurm(argv)).splitlines():
            node, _, reason = line.partition("|")
            for host in expand_hostlist(node):
                reasons.setdefault(host, reason.strip())
        return reasons

    async def tagged_jobs(self) -> dict[str, str]:
        """This user's active jobs that carry a cluster tag: job id -> cluster id."""
        out = await self._slurm(["squeue", "-h", "--me", "-o", "%i|%k"])
        found = {}
        for line in out.splitlines():
            job_id, _, comment = line.partition("|")
            cluster_id = cluster_id_of_comment(comment)
            if cluster_id is not None and job_id.strip().isdigit():
                found[job_id.strip()] = cluster_id
        return found

    async def find_tagged(self, cluster_id: str) -> str | None:
        """The job id of the active job tagged for ``cluster_id`` (the newest), or None."""
        jobs = [j for j, c in (await self.tagged_jobs()).items() if c == cluster_id]
        return max(jobs, key=int) if jobs else None


@dataclass(frozen=True)
class _Answer:
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


# -- parsing (pure functions) -------------------------------------------------------------------
def parse_squeue_line(line: str) -> JobInfo | None:
    parts = line.split("|", len(_SQUEUE_FIELDS) - 1)
    if len(parts) != len(_SQUEUE_FIELDS):
        log.warning("unexpected squeue line: %r", line)
        return None
    job_id, state, count, start, left, limit, nodelist, name, comment, reason = (
        p.strip() for p in parts
    )
    return JobInfo(
        job_id=job_id,
        state=state.split()[0] if state else "UNKNOWN",
        reason=None if reason in {"", "None", "(null)"} else reason,
        nodes=tuple(expand_hostlist(nodelist)),
        node_count=int(count) if count.isdigit() else 0,
        start_time=parse_timestamp(start),
        time_left=parse_duration(left),
        time_limit=parse_duration(limit),
        name=name,
        comment="" if comment == "(null)" else comment,
    )


def parse_sacct(out: str) -> dict[str, JobInfo]:
    infos: dict[str, JobInfo] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 7 or not parts[0].split(".")[0].isdigit() or "." in parts[0]:
            continue
        job_id, state, exit_code, nodelist, start, limit, name = parts[:7]
        infos[job_id] = JobInfo(
            job_id=job_id,
            state=state.split()[0] if state else "UNKNOWN",  # "CANCELLED by 1000"
            nodes=tuple(expand_hostlist(nodelist)),
            node_count=len(expand_hostlist(nodelist)),
            start_time=parse_timestamp(start),
            time_limit=parse_duration(limit),
            name=name,
            exit_code=parse_exit_code(exit_code),
            source="sacct",
        )
    return infos


def parse_scontrol_job(out: str) -> JobInfo | None:
    """One ``scontrol show job -o`` line (``Key=Value`` pairs) → JobInfo."""
    fields = dict(re.findall(r"(\w+)=(\S*)", out))
    if "JobId" not in fields:
        return None
    nodes = expand_hostlist(fields.get("NodeList", ""))
    return JobInfo(
        job_id=fields["JobId"],
        state=fields.get("JobState", "UNKNOWN"),
        nodes=tuple(nodes),
        node_count=len(nodes),
        start_time=parse_timestamp(fields.get("StartTime", "")),
        time_limit=parse_duration(fields.get("TimeLimit", "")),
        name=fields.get("JobName", ""),
        exit_code=parse_exit_code(fields.get("ExitCode", "")),
        source="scontrol",
    )


def _merge_final(live: JobInfo | None, history: JobInfo | None) -> JobInfo | None:
    if live is None:
        return history
    if history is None:
        return live
    # squeue knows the nodes and limits best; accounting knows the exit code.
    return JobInfo(**{**live.__dict__, "exit_code": history.exit_code, "source": "squeue+sacct"})


def parse_sinfo(out: str) -> list[Partition]:
    """Aggregate sinfo's per-(partition, node shape) lines into one entry per partition."""
    merged: dict[str, Partition] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 8:
            continue
        name, avail, counts, cpus, mem, gres, limit, pname = parts
        alloc_idle_other_total = [int(x) for x in counts.split("/") if x.isdigit()]
        if len(alloc_idle_other_total) != 4:
            continue
        _, idle, _, total = alloc_idle_other_total
        gres_items = tuple(g for g in gres.split(",") if g and g != "(null)")
        entry = Partition(
            name=name,
            available=avail == "up",
            idle_nodes=idle,
            total_nodes=total,
            cpus_per_node=_leading_int(cpus),
            memory_mb=_leading_int(mem),
            gres=gres_items,
            max_time=parse_duration(limit),
            is_default=pname.endswith("*"),
            gpus_per_node=_gpus_in(gres_items),
        )
        previous = merged.get(name)
        if previous is not None:
            entry = Partition(
                **{
                    **entry.__dict__,
                    "idle_nodes": previous.idle_nodes + idle,
                    "total_nodes": previous.total_nodes + total,
                    "cpus_per_node": min(previous.cpus_per_node, entry.cpus_per_node),
                    "memory_mb": min(previous.memory_mb, entry.memory_mb),
                    "gres": tuple(dict.fromkeys(previous.gres + entry.gres)),
                }
            )
        merged[name] = entry
    return list(merged.values())


def _leading_int(text: str) -> int:
    match = re.match(r"\d+", text)
    return int(match.group()) if match else 0


def _gpus_in(gres: Sequence[str]) -> int:
    for item in gres:
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item)
        if match:
            return int(match.group(1))
    return 0


_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+)$")


def parse_duration(text: str) -> int | None:
    """Seconds in a duration as Slurm prints it (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``)."""
    text = text.strip()
    if text.isdigit():  # a bare number is minutes to Slurm (sacct -c prints limits so)
        return int(text) * 60
    match = _DURATION.match(text)
    if not match:
        return None  # UNLIMITED, NOT_SET, INVALID, N/A
    days, a, b, c = match.groups()
    fields = [int(x) for x in (a, b, c) if x is not None]
    while len(fields) < 3:
        fields.insert(0, 0)
    hours, minutes, seconds = fields
    if days is not None and b is None and a is not None:
        # "D-HH:MM" is not printed by Slurm; "D-HH:MM:SS" is. Keep the common reading.
        hours, minutes, seconds = fields[1], fields[2], 0
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def parse_timestamp(text: str) -> datetime | None:
    text = text.strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None  # N/A, Unknown, None


def parse_exit_code(text: str) -> int | None:
    """``"2:0"`` → 2; ``"0:15"`` (killed by signal 15) → 128 + 15."""
    code, _, sig = text.strip().partition(":")
    if not code.isdigit():
        return None
    if sig.isdigit() and int(sig) and not int(code):
        return 128 + int(sig)
    return int(code)


_HOST_RANGE = re.compile(r"\[([^\]]+)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``"node[1-3,7],gpu01"`` → ``["node1", "node2", "node3", "node7", "gpu01"]``.

    Written here rather than running ``scontrol show hostnames`` once per job on every poll.
    """
    hostlist = hostlist.strip()
    if not hostlist or hostlist in {"(null)", "None assigned", "N/A"}:
        return []
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [i for i in items if i]


def _expand_one(item: str) -> list[str]:
    match = _HOST_RANGE.search(item)
    if not match:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    expanded = []
    for part in match.group(1).split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            names = [lo]
        else:
            width = len(lo)
            names = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        for name in names:
            expanded.extend(_expand_one(prefix + name + suffix))
    return expanded


def _job_id(job_id: str | int) -> str:
    text = str(job_id).strip()
    if not re.fullmatch(r"\d+(_\d+)?", text):
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
