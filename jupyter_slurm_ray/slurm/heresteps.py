"""``mode = "here"``'s scheduler: a cluster's job script run as a step of the kernel's own Slurm
allocation (``srun --overlap --jobid=<allocation>``) instead of a job of its own.

``HereSteps`` is a :class:`~.slurm.SlurmClient` that also knows such steps by their ids,
``here-<allocation>-<runner pid>`` (never a Slurm job id); Slurm's own jobs it passes on.
``schedulers.py`` picks it by a job's id and lets a watcher or an inventory ask about both
kinds at once.

- ``submit`` (given the :class:`HeadStep`) starts a *runner* (a constant sh program, below) in
  a new session where the transport runs commands. The runner runs ``srun --overlap --jobid=J
  --job-name=<id> --nodes=1 --ntasks=1 --nodelist=HEAD … bash -s`` with the job script's text on
  srun's stdin (no file to swap, nothing on a command line others can read), the script's
  ``--export`` list as srun's (as it would have been sbatch's) plus ``JSR_JOB_ID=<id>`` (the
  bootstrap's job id: its temp dirs and port claims stay apart from another cluster's in the
  same allocation), the step's output in the job dir's ``slurm-<id>.out/.err``, and keeps the
  step's exit status.
- ``query`` combines the runner's files (``~/.jupyter-slurm-ray/here-steps``: its start, the
  step's exit status, a cancel asked) with the allocation as Slurm shows it (the user's shared
  squeue): the allocation's end ends the cluster with the allocation's state (CANCELLED,
  TIMEOUT, …). Where the runner cannot be seen (another host), the step is looked up by its
  name (``squeue --steps``).
- ``cancel`` asks the steps named after the id to stop (``scancel --signal=USR2``: the
  bootstrap stops its Ray and its worker step, and exits); asked again, it ends them. The
  allocation itself is never touched.
- ``extend`` is refused: the cluster lives as long as its allocation.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from ..bootstrap.jsr_wire import JOB_ID_VARIABLE
from ..errors import CommandError, ExtendRefused, SlurmError, SlurmUnavailable
from ..naming import allocation_of, is_here_job_id
from ..scheduler.interface import RequestT, Scheduler
from ..scheduler.kind import JobRequest
from ..scheduler.records import Association, JobInfo, Partition, Qos, UsageRow
from ..spec import ClusterSpec
from ..transport import CommandResult, Transport
from .client import SlurmClient, is_script_text, run_program, script_options
from .header import sbatch_header
from .hereplan import HeadStep, head_step, plan_here, planned_spec

if TYPE_CHECKING:
    from .queuecache import SharedQueue

__all__ = [
    "HereSteps",
    "StepRun",
    "allocation_of",
    "is_here_job_id",
    "step_state",
]

STATE_DIR = "$HOME/.jupyter-slurm-ray/here-steps"  # expanded by the shell of the job's user
STARTING_GRACE = 60.0  # s a step may take to show in Slurm before its absence means it ended
CANCEL_WAIT = 10.0  # s a cancel waits for a step launched a moment ago to show in Slurm
_STEP_ID = re.compile(r"[0-9]+(?:_[0-9]+)?\.[0-9]+", re.ASCII)
_GONE = re.compile(r"already completing or completed|invalid job id", re.IGNORECASE)

# The launcher: keeps the job script from its stdin in the state dir, starts the runner in a
# new session, waits for its id, prints it. $0 the runner, "$@" its arguments from the job dir on.
_LAUNCH = r"""
umask 077
d=__STATE__; mkdir -p -- "$d" && chmod 700 -- "$d" || exit 1
find "$d" -maxdepth 1 -type f -mtime +30 -delete 2>/dev/null
tag=$$.$(date +%s%N)
cat >"$d/script-$tag" || exit 1
setsid sh -c "$0" jsr-here "$d" "$tag" "$@" </dev/null >/dev/null 2>&1 &
i=0
while [ ! -e "$d/launch-$tag" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
cat -- "$d/launch-$tag" && rm -f -- "$d/launch-$tag"
""".replace("__STATE__", STATE_DIR)

# The runner: $1 state dir, $2 launch tag, $3 job dir, $4 allocation, $5 the --export list,
# $6 the job's tag, $7 the cluster's hosts; then srun's options. Its files: <id>.start (its
# ps start time; epoch and host; hosts; tag), <id>.exit (status, epoch).
_RUNNER = r"""
d=$1 tag=$2 dir=$3 alloc=$4 export=$5 comment=$6 hosts=$7
shift 7
id="here-$alloc-$$"
me=$(uname -n); me=${me%%.*}
put() { printf '%s\n' "$2" >"$d/$1.tmp.$$" && mv -f -- "$d/$1.tmp.$$" "$d/$1"; }
put "$id.start" "$(ps -o lstart= -p $$)
$(date +%s) $me
$hosts
$comment"
put "launch-$tag" "$id"
code=1
if [ -e "$d/$id.cancelled" ]; then
  code=0
elif cd -- "$dir" && exec 3<"$d/script-$tag"; then
  rm -f -- "$d/script-$tag"
  case $export in ALL) x=ALL ;; NONE) x=__JOB_ID__ ;; *) x="$export,__JOB_ID__" ;; esac
  __JOB_ID__=$id srun --jobid="$alloc" --job-name="$id" --export="$x" --chdir="$dir" "$@" \
    bash -s <&3 >"slurm-$id.out" 2>"slurm-$id.err"
  code=$?
  exec 3<&-
fi
rm -f -- "$d/script-$tag"
put "$id.exit" "$code $(date +%s)"
""".replace("__JOB_ID__", JOB_ID_VARIABLE)

# Each step's runner files, and whether its runner still runs here:
# "id|this host|runner's ps start now|runner's ps start|epoch host|hosts|tag|exit|cancelled".
_QUERY = r"""
d=__STATE__
me=$(uname -n); me=${me%%.*}
for id in "$@"; do
  [ -e "$d/$id.start" ] || continue
  now=$(ps -o lstart= -p "${id##*-}" 2>/dev/null)
  start=$(tr '\n' '|' <"$d/$id.start")
  ex=$(cat -- "$d/$id.exit" 2>/dev/null)
  c=; [ -e "$d/$id.cancelled" ] && c=cancelled
  printf '%s|%s|%s|%s%s|%s\n' "$id" "$me" "$now" "$start" "$ex" "$c"
done
""".replace("__STATE__", STATE_DIR)

# A cancel noted (the runner starts no srun after it; the query says CANCELLED): whether it is
# the first, asked again, or the step had ended.
_MARK_CANCEL = r"""
d=__STATE__ id=$1
if [ -e "$d/$id.exit" ]; then echo ended
elif [ -e "$d/$id.cancelled" ]; then echo again
else umask 077; mkdir -p -- "$d" && : >"$d/$id.cancelled" && echo first
fi
""".replace("__STATE__", STATE_DIR)

_ENDED = '[ -e "__STATE__/$1.exit" ]'.replace("__STATE__", STATE_DIR)


@dataclass(frozen=True)
class StepRun:
    """What a step's runner files say. ``alive``: the runner still runs (None: it runs on
    another host than the one asked)."""

    step_id: str
    host: str
    started: float | None
    hosts: tuple[str, ...]
    comment: str
    exit_code: int | None
    cancelled: bool
    alive: bool | None


def parse_run_line(line: str) -> StepRun | None:
    """One line of the query (see ``_QUERY``)."""
    parts = [part.strip() for part in line.split("|")]
    if len(parts) != 9 or not is_here_job_id(parts[0]):
        return None
    step_id, here, now, lstart, launch, hosts, comment, ended, cancelled = parts
    epoch, _, host = launch.partition(" ")
    final = ended.split()
    return StepRun(
        step_id,
        host,
        float(epoch) if epoch.isdigit() else None,
        tuple(h for h in hosts.split(",") if h),
        comment,
        int(final[0]) if final and final[0].isdigit() else None,
        cancelled == "cancelled",
        (bool(now) and now == lstart) if host == here else None,
    )


def step_state(
    step_id: str,
    run: StepRun | None,
    allocation: JobInfo | None,
    listed: bool | None,
    now: float,
) -> JobInfo | None:
    """The head step's state (None: unknown) from its runner's files, the allocation as Slurm
    shows it, and (when asked) whether Slurm lists a step of that name. The allocation's end
    is the cluster's end; a step that ended by itself is COMPLETED or FAILED by its status."""
    ended = allocation is not None and allocation.is_final
    if run is not None and run.exit_code is not None:
        code = run.exit_code
        if run.cancelled:
            return _info(step_id, "CANCELLED", run, allocation, exit_code=code)
        if allocation is not None and (ended or allocation.state != "RUNNING"):
            return _allocation_ended(step_id, run, allocation)  # its end ended the step
        state = "COMPLETED" if code == 0 else "FAILED"
        return _info(step_id, state, run, allocation, exit_code=code)
    if allocation is None:
        return None  # Slurm no longer knows the allocation, and the step left no status here
    if ended:
        return _allocation_ended(step_id, run, allocation)
    starting = run is not None and run.started is not None and now - run.started < STARTING_GRACE
    if (run is not None and run.alive) or listed or starting:
        return _info(step_id, "RUNNING", run, allocation)
    if run is None:
        return None  # no runner files here and no step of that name: Slurm does not know it
    where = f"its runner on {run.host} is gone" if run.host else "its runner is gone"
    reason = f"the head's step ended without an exit status ({where})"
    return _info(step_id, "FAILED", run, allocation, reason=reason)


def _allocation_ended(step_id: str, run: StepRun | None, allocation: JobInfo) -> JobInfo:
    reason = f"allocation {allocation.job_id} ended {allocation.state}"
    return _info(step_id, allocation.state, run, allocation, reason=reason)


def _info(
    step_id: str,
    state: str,
    run: StepRun | None,
    allocation: JobInfo | None,
    *,
    exit_code: int | None = None,
    reason: str | None = None,
) -> JobInfo:
    hosts = run.hosts if run is not None and run.hosts else ()
    started = run.started if run is not None else None
    running = state == "RUNNING" and allocation is not None
    return JobInfo(
        step_id,
        state,
        reason=reason,
        nodes=hosts or (allocation.nodes if allocation is not None else ()),
        node_count=len(hosts) or (allocation.node_count if allocation is not None else 0),
        start_time=datetime.fromtimestamp(started) if started else None,
        time_left=allocation.time_left if running else None,  # type: ignore[union-attr]
        time_limit=allocation.time_limit if allocation is not None else None,
        name="here",
        exit_code=exit_code,
        source="here",
        comment=run.comment if run is not None else "",
    )


#: What sbatch would be asked for, which a cluster in the kernel's own allocation does not ask:
#: the allocation's own nodes, walltime, partition… apply.
HERE_DECIDED = MappingProxyType(
    {
        "nodes": "here_nodes chooses the allocation's nodes (a number, or a host list; unset: all)",
        "time": "the allocation's own walltime applies",
        **{
            name: f"the allocation's own {name} applies"
            for name in ("partition", "account", "qos", "reservation", "constraint")
        },
        "exclusive": "the allocation's nodes are what they are",
        "extra_sbatch": "nothing is submitted",
    }
)


class HereSteps(Scheduler):
    """The head steps of clusters in their kernels' allocations, and Slurm's jobs (a here
    cluster's worker jobs, the allocations themselves) through Slurm's own scheduler."""

    source = "here"
    system = "--here"
    mode = "here"
    also_answers = frozenset({"slurm"})
    in_allocation = True
    decided = HERE_DECIDED

    @classmethod
    def refusal(cls, name: str, value: object, settings: Mapping[str, object]) -> str | None:
        if name == "nodes" and (value == 1 or settings.get("here_nodes") is not None):
            return None  # planned from here_nodes (``hereplan.planned_spec``)
        if value in (None, False, ()):
            return None
        return (
            "unset with mode 'here' (the cluster runs as steps of the kernel's allocation): "
            + HERE_DECIDED[name]
        )

    @classmethod
    def owns(cls, job_id: str) -> bool:
        return is_here_job_id(job_id)

    @classmethod
    def header(cls, request: JobRequest) -> list[str]:
        return sbatch_header(request)  # a step reads --chdir, --export, --comment of it

    async def for_request(self, request: RequestT) -> tuple[RequestT, Scheduler]:
        """The cluster planned in the kernel's allocation (SpecError naming the setting that
        does not fit): its nodes the chosen hosts, its CPUs the plan's; submitted as the head's
        step there."""
        if not isinstance(request, ClusterSpec):
            return request, self
        plan = await plan_here(self.transport, request)
        spec = planned_spec(request, plan)
        steps = HereSteps(self.transport, head=head_step(plan, spec), timeout=self.timeout)
        return cast(RequestT, spec), steps

    @classmethod
    def create(
        cls, transport: Transport, *, timeout: float = 30.0, shared: Any = None
    ) -> HereSteps:
        return cls(transport, timeout=timeout, shared=shared)

    @classmethod
    def fixed_size(cls, least: int) -> str | None:
        return f"{least}: a --here cluster has its allocation's nodes (here_nodes)"

    @classmethod
    def no_usage(cls, job_ids: Sequence[str]) -> str:
        here = next((job for job in job_ids if is_here_job_id(job)), None)
        if here is None:
            return ""
        return f"a --here cluster's steps count as allocation {allocation_of(here)}'s usage"

    def __init__(
        self,
        transport: Transport,
        *,
        head: HeadStep | None = None,
        timeout: float = 30.0,
        shared: SharedQueue | None = None,
    ) -> None:
        self.slurm = SlurmClient(transport, timeout=timeout, shared=shared)
        super().__init__(transport, timeout=timeout)
        self.head = head

    @property
    def commands_run(self) -> int:  # Slurm's commands and its own, counted once
        return self.slurm.commands_run

    @commands_run.setter
    def commands_run(self, count: int) -> None:
        self.slurm.commands_run = count

    @property
    def shared(self) -> SharedQueue | None:
        return self.slurm.shared

    async def _sh(self, program: str, *args: str) -> str:
        self.commands_run += 1
        argv = ["sh", "-c", program, "jsr-here", *args]
        return await run_program(self.transport, argv, "--here", self.timeout)

    # -- submit / cancel ----------------------------------------------------------------------
    async def submit(self, script: str, *, timeout: float = 60.0) -> str:
        """With a head step: start the job script's text as that step (its id); else sbatch."""
        if self.head is None:
            return await self.slurm.submit(script, timeout=timeout)
        if not is_script_text(script):
            raise SlurmError("--here runs a job script's text (#!…), not a file")
        options = script_options(script)
        job_dir = options.get("--chdir", "")
        if not job_dir.startswith("/"):
            raise SlurmError("--here: the job script has no #SBATCH --chdir (its job dir)")
        head = self.head
        export, comment = options.get("--export") or "ALL", options.get("--comment", "")
        argv = ["sh", "-c", _LAUNCH, _RUNNER, job_dir, head.allocation, export, comment]
        argv += [",".join(head.hosts), *head.srun_options()]
        self.commands_run += 1
        try:
            result = await self.transport.run(argv, input=script, timeout=timeout)
        except CommandError as exc:
            raise SlurmError(f"the head's step could not start: {exc.stderr.strip()}") from None
        step_id = result.stdout.strip()
        if not is_here_job_id(step_id):
            raise SlurmError(f"the head's step did not start (its runner said {step_id!r})")
        return step_id

    async def cancel(
        self, job_id: str, *, signal: str | None = None, batch_only: bool = False
    ) -> None:
        """A here step: its steps asked to stop (USR2), or ended when asked again; the
        allocation is left alone. Anything else: Slurm's scancel."""
        if not is_here_job_id(str(job_id)):
            return await self.slurm.cancel(job_id, signal=signal, batch_only=batch_only)
        if signal is not None or batch_only:
            raise SlurmError("a --here cluster's step is stopped whole, not signalled")
        step_id, allocation = str(job_id).strip(), allocation_of(str(job_id))
        asked = (await self._sh(_MARK_CANCEL, step_id)).strip()
        if asked == "ended":
            return
        deadline = time.monotonic() + CANCEL_WAIT
        while True:
            steps = await self._named_steps(allocation, step_id)
            if steps is None:
                return  # the allocation ended, and its steps with it
            if steps:
                gently = [] if asked == "again" else ["--signal=USR2"]
                try:
                    await self.slurm.output(["scancel", *gently, *steps])
                except SlurmError as exc:  # it ended meanwhile: nothing left to stop
                    if not _GONE.search(str(exc)):
                        raise
                return
            if time.monotonic() >= deadline or await self._ended(step_id):
                return
            await asyncio.sleep(0.5)

    node_runner = SlurmClient.node_runner

    async def run_on_nodes(
        self,
        job_id: str,
        argv: Sequence[str],
        *,
        nodes: int,
        hosts: str | None = None,
        timeout: float = 30.0,
    ) -> CommandResult:
        """On the nodes of a --here cluster's allocation (or of a Slurm job)."""
        allocation = allocation_of(job_id) if is_here_job_id(job_id) else job_id
        return await self.slurm.run_on_nodes(
            allocation, argv, nodes=nodes, hosts=hosts, timeout=timeout
        )

    async def extend(self, job_id: str, minutes: int) -> None:
        if not is_here_job_id(str(job_id)):
            return await self.slurm.extend(job_id, minutes)
        allocation = allocation_of(str(job_id))
        raise ExtendRefused(
            f"a --here cluster lives as long as its allocation {allocation}: extend the "
            f"allocation itself (scontrol update JobId={allocation} TimeLimit=+{minutes}, where "
            "the site allows it)"
        )

    # -- watching -------------------------------------------------------------------------------
    async def query(self, job_ids: Iterable[str], *, max_age: float = 0.0) -> dict[str, JobInfo]:
        ids = sorted({str(job_id).strip() for job_id in job_ids})
        steps = [job_id for job_id in ids if is_here_job_id(job_id)]
        if not steps:
            return await self.slurm.query(ids, max_age=max_age)
        jobs = [job_id for job_id in ids if job_id not in steps]
        allocations = sorted({allocation_of(step) for step in steps})
        infos = await self.slurm.query([*jobs, *allocations], max_age=max_age)
        found = {job_id: infos[job_id] for job_id in jobs if job_id in infos}
        runs = {run.step_id: run for run in await self._runs(steps)}
        for step_id in steps:
            allocation, run = infos.get(allocation_of(step_id)), runs.get(step_id)
            listed = None
            unseen = run is None or (run.exit_code is None and not run.alive)
            if unseen and allocation is not None and not allocation.is_final:
                listed = bool(await self._named_steps(allocation.job_id, step_id))
            info = step_state(step_id, run, allocation, listed, time.time())
            if info is not None:
                found[step_id] = info
        if max_age > 0 and any(found[s].state == "FAILED" for s in steps if s in found):
            return await self.query(ids)  # the allocation's answer may predate the step's end
        return found

    async def _runs(self, step_ids: list[str]) -> list[StepRun]:
        out = await self._sh(_QUERY, *step_ids)
        return [run for line in out.splitlines() if (run := parse_run_line(line))]

    async def _ended(self, step_id: str) -> bool:
        result = await self.transport.run(["sh", "-c", _ENDED, "jsr-here", step_id], check=False)
        return result.returncode == 0

    async def _named_steps(self, allocation: str, name: str) -> list[str] | None:
        """The ids of the allocation's steps called ``name`` (None: Slurm no longer shows the
        allocation)."""
        argv = ["squeue", "-h", "--steps", "-j", allocation, "-o", "%i|%j"]
        answer = await self.slurm.answer(argv)
        if answer.returncode != 0:
            if "invalid job id" in answer.stderr.lower():
                return None
            raise SlurmUnavailable(f"squeue --steps: {answer.stderr.strip() or 'failed'}")
        rows = (line.split("|", 1) for line in answer.stdout.splitlines() if "|" in line)
        steps = [(step.strip(), named.strip()) for step, named in rows]
        return [step for step, named in steps if named == name and _STEP_ID.fullmatch(step)]

    # -- the rest is Slurm's: its jobs, its site ------------------------------------------------
    def unreachable(self, silence: SlurmUnavailable) -> SlurmUnavailable:
        return self.slurm.unreachable(silence)

    async def history(
        self, job_ids: Sequence[str], *, remembered: Sequence[str] | None = None
    ) -> dict[str, JobInfo]:
        return await self.slurm.history(job_ids, remembered=remembered)

    async def partitions(self) -> list[Partition]:
        return await self.slurm.partitions()

    async def memory_settings(self) -> tuple[str, str]:
        return await self.slurm.memory_settings()

    async def associations(self) -> list[Association]:
        return await self.slurm.associations()

    async def qos(self) -> dict[str, Qos]:
        return await self.slurm.qos()

    async def usage(self, job_ids: Sequence[str]) -> list[UsageRow]:
        return await self.slurm.usage(job_ids)

    async def node_reasons(self, nodes: Sequence[str]) -> dict[str, str]:
        return await self.slurm.node_reasons(nodes)

    async def tagged_jobs(self) -> dict[str, str]:
        return await self.slurm.tagged_jobs()

    async def tagged_worker_jobs(self) -> dict[str, str]:
        return await self.slurm.tagged_worker_jobs()

    async def work_dirs(self) -> dict[str, str]:
        return await self.slurm.work_dirs()

    async def find_tagged(self, cluster_id: str) -> str | None:
        return await self.slurm.find_tagged(cluster_id)
