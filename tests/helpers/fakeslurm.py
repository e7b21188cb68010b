"""A scripted Slurm for the fast tier: Slurm's commands answered from a table of jobs.

``FakeTransport`` runs everything that is not a Slurm command for real on this machine (the
package's constant shell programs: job dir, lease, events), as the current user, and answers
``sbatch``/``squeue``/``sacct``/``scontrol``/``scancel``/``sinfo``/``sacctmgr`` from
:class:`FakeSlurm` (accounts and QOSes as on the testbed; usage lines set per job by tests;
``scontrol update TimeLimit=+N`` refused unless ``may_extend``).
Tests move jobs between states, write the bootstrap's events into the job dir, take the
controller away (``slurm.down = True``), lose a command's answer (``hang_before``/``hang_after``)
or keep a command in flight until the test releases it (``transport.hold("sbatch")``) to see
what the package makes of it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from jupyter_slurm_ray.errors import TransportError
from jupyter_slurm_ray.slurm.client import AS_THIS_USER
from jupyter_slurm_ray.spec.units import parse_duration
from jupyter_slurm_ray.transport import DEFAULT_TIMEOUT, CommandResult, LocalTransport
from jupyter_slurm_ray.ui.formatting import format_duration

#: Real output of Slurm 22.05 (tests/resources/slurm-output/), for what the fake does not make up.
RECORDED = Path(__file__).parent.parent / "resources" / "slurm-output" / "22.05.8"
SLURM_COMMANDS = (
    "sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "sacctmgr", "srun"
)  # fmt: skip
NO_CONTROLLER = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
#: sinfo's partition lines (``%R|%a|%F|%c|%m|%G|%l|%P``) as the real testbed prints them.
TESTBED_PARTITIONS = (
    "debug|up|0/3/0/3|2|6428|gpu:2|infinite|debug*|1-infinite",
    "short|up|0/3/0/3|2|6428|gpu:2|30:00|short|1-2",
)
#: ``sacctmgr show user withassoc`` for alice, and ``show qos``, as the testbed answers.
TESTBED_ASSOCIATIONS = ("alice|physics|physics||normal,short|normal||||None",)
TESTBED_QOS = ("normal|||||", "short|00:10:00|node=1|||DenyOnLimit")
NO_ACCOUNTING = (
    "sacctmgr: error: You are not running a supported accounting_storage plugin\n"
    "Only 'accounting_storage/slurmdbd' and 'accounting_storage/mysql' are supported."
)


@dataclass
class FakeJob:
    job_id: str
    script_path: str  # the file submitted, or for a script on stdin its copy in the job dir
    comment: str = ""
    name: str = "ray"
    state: str = "PENDING"
    reason: str = "Priority"
    nodes: str = ""
    time_left: str = "9:50"
    time_limit: str = "10:00"
    exit_code: str = "0:0"
    forgotten: bool = False  # past MinJobAge and without accounting: Slurm knows it no more
    start: str = "N/A"  # actual start, or Slurm's estimate while PENDING
    usage: list[str] = field(default_factory=list)  # sacct usage lines (USAGE_FIELDS)
    script: str = ""  # the text sbatch got


@dataclass
class FakeSlurm:
    """Jobs by id, and the controller's mood."""

    jobs: dict[str, FakeJob] = field(default_factory=dict)
    down: bool = False  # the controller does not answer
    accounting: bool = False  # sacct and sacctmgr answer (else only scontrol remembers ended jobs)
    user: str = "alice"
    associations: list[str] = field(default_factory=lambda: list(TESTBED_ASSOCIATIONS))
    qos: list[str] = field(default_factory=lambda: list(TESTBED_QOS))
    may_extend: bool = False  # an operator: scontrol update TimeLimit=+N is allowed
    enforces_memory: bool = False  # cgroup ConstrainRAMSpace (DefMemPerCPU=1024), as a site
    refuse_submit: str | None = None  # sbatch's error message, if it refuses
    node_reasons: dict[str, str] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=lambda: list(TESTBED_PARTITIONS))
    calls: list[tuple[str, ...]] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(100))

    def job(self, job_id: str) -> FakeJob:
        return self.jobs[job_id]

    def only_job(self) -> FakeJob:
        (job,) = self.jobs.values()
        return job

    def run(self, job_id: str, nodes: str = "node1") -> None:
        job = self.jobs[job_id]
        job.state, job.reason, job.nodes = "RUNNING", "None", nodes

    def end(self, job_id: str, state: str = "COMPLETED", exit_code: str = "0:0") -> None:
        job = self.jobs[job_id]
        job.state, job.reason, job.exit_code = state, "None", exit_code

    # -- answering commands -----------------------------------------------------------------
    def answer(self, argv: Sequence[str], input: str | None) -> CommandResult:
        self.calls.append(tuple(argv))
        command = argv[0]
        if self.down and command != "sacct" and argv[1:] != ["--version"]:  # asks no one
            return _result(argv, 1, "", NO_CONTROLLER)
        handler = getattr(self, f"_{command}")
        return handler(list(argv), input) if command == "sbatch" else handler(list(argv))

    def _sbatch(self, argv: list[str], input: str | None = None) -> CommandResult:
        """sbatch SCRIPT, or sbatch with the script on stdin (as sbatch, the job dir is
        ``--chdir``'s; the script's copy is its job.sbatch)."""
        if argv[1:] == ["--version"]:
            return _result(argv, 0, "slurm 22.05.8\n")
        if self.refuse_submit:
            return _result(argv, 1, "", f"sbatch: error: {self.refuse_submit}")
        if len(argv) > 1:
            path = argv[-1]
            with open(path) as script:
                text = script.read()
        else:
            text = input or ""
            chdir = re.search(r"^#SBATCH --chdir=(\S+)", text, re.M)
            path = f"{chdir.group(1) if chdir else '.'}/job.sbatch"
        comment = re.search(r"^#SBATCH --comment=(\S+)", text, re.M)
        name = re.search(r"^#SBATCH --job-name=(\S+)", text, re.M)
        job_id = str(next(self._ids))
        self.jobs[job_id] = FakeJob(
            job_id,
            path,
            comment.group(1) if comment else "",
            name.group(1) if name else "",
            script=text,
        )
        return _result(argv, 0, f"{job_id}\n")

    def _squeue(self, argv: list[str]) -> CommandResult:
        if "--me" in argv and argv[argv.index("-o") + 1] == "%i|%k":  # our tagged jobs
            lines = [f"{j.job_id}|{j.comment}" for j in self._visible() if j.state in _ACTIVE]
            return _result(argv, 0, "".join(line + "\n" for line in lines))
        if "--me" in argv and argv[argv.index("-o") + 1] == "%i|%Z":  # their job dirs
            lines = [
                f"{j.job_id}|{os.path.dirname(j.script_path)}" for j in self._visible()
                if j.state in _ACTIVE
            ]  # fmt: skip
            return _result(argv, 0, "".join(line + "\n" for line in lines))
        if "--me" in argv:  # the whole queue of the user (shared between processes)
            found = self._visible()
        else:
            wanted = argv[argv.index("-j") + 1].split(",")
            found = [self.jobs[j] for j in wanted if j in self.jobs and not self.jobs[j].forgotten]
            if not found:
                return _result(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
        lines = [
            "|".join(
                (
                    j.job_id,
                    j.state,
                    "1",
                    j.start,
                    j.time_left,
                    j.time_limit,
                    j.nodes or "(null)",
                    j.name,
                    j.comment,
                    j.reason,
                )
            )
            for j in found
        ]
        return _result(argv, 0, "".join(line + "\n" for line in lines))

    def _sacct(self, argv: list[str]) -> CommandResult:
        if not self.accounting:
            return _result(argv, 1, "", "sacct: error: Slurm accounting storage is disabled")
        wanted = argv[argv.index("-j") + 1].split(",")
        if "--noconvert" in argv:  # usage: allocations and steps
            lines = [line for i in wanted if i in self.jobs for line in self.jobs[i].usage]
            return _result(argv, 0, "".join(line + "\n" for line in lines))
        lines = [
            f"{j.job_id}|{j.state}|{j.exit_code}|{j.nodes}|N/A|10|{j.name}"
            for j in (self.jobs[i] for i in wanted if i in self.jobs)
            if j.state not in _ACTIVE
        ]
        return _result(argv, 0, "".join(line + "\n" for line in lines))

    def _sacctmgr(self, argv: list[str]) -> CommandResult:
        if not self.accounting:
            return _result(argv, 1, "", NO_ACCOUNTING)
        if "qos" in argv:
            return _result(argv, 0, "".join(line + "\n" for line in self.qos))
        asked = next(a for a in argv if a.startswith("user=")).removeprefix("user=")
        lines = [line for line in self.associations if line.split("|")[0] == asked]
        return _result(argv, 0, "".join(line + "\n" for line in lines))

    def _scontrol(self, argv: list[str]) -> CommandResult:
        if argv[1] == "update":
            return self._scontrol_update(argv)
        if argv[1:3] == ["show", "config"]:  # the testbed's: 22.05 enforced, or permissive
            name = (
                "scontrol-config.out" if self.enforces_memory else "scontrol-config-permissive.out"
            )
            return _result(argv, 0, (RECORDED / name).read_text())
        if argv[1:3] == ["show", "partition"]:
            return _result(argv, 0, (RECORDED / "scontrol-partitions.out").read_text())
        job = self.jobs.get(argv[-1])
        if job is None or job.forgotten:
            return _result(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
        line = (
            f"JobId={job.job_id} JobName={job.name} JobState={job.state} "
            f"NodeList={job.nodes or '(null)'} ExitCode={job.exit_code} TimeLimit={job.time_limit}"
        )
        return _result(argv, 0, line + "\n")

    def _scontrol_update(self, argv: list[str]) -> CommandResult:
        fields = dict(arg.split("=", 1) for arg in argv[2:])
        job = self.jobs.get(fields["JobId"])
        if job is None or job.state not in _ACTIVE:
            return _result(argv, 1, "", "slurm_update error: Invalid job id specified")
        if not self.may_extend:
            return _result(argv, 1, "", f"Access/permission denied for job {job.job_id}")
        added = int(fields["TimeLimit"].removeprefix("+")) * 60
        job.time_limit = format_duration((parse_duration(job.time_limit) or 0) + added)
        job.time_left = format_duration((parse_duration(job.time_left) or 0) + added)
        return _result(argv, 0, "")

    def _srun(self, argv: list[str]) -> CommandResult:
        """srun --jobid=J --nodes=N … COMMAND…: COMMAND run here once per node of the running
        job, with that node's SLURMD_NODENAME, as a step would on each node."""
        options = dict(a[2:].partition("=")[::2] for a in argv[1:] if a.startswith("--"))
        job = self.jobs.get(options.get("jobid", ""))
        if job is None or job.state != "RUNNING":
            why = f"Unable to create step for job {options.get('jobid')}: Invalid job id"
            return _result(argv, 1, "", f"srun: error: {why}")
        command = argv[next(i for i, a in enumerate(argv) if i and not a.startswith("--")) :]
        nodes = job.nodes.split(",")[: int(options.get("nodes", "1"))]
        runs = [
            subprocess.run(
                command, capture_output=True, text=True, timeout=10, check=False,
                env={**os.environ, "SLURMD_NODENAME": node},
            )
            for node in nodes
        ]  # fmt: skip
        code = max(run.returncode for run in runs)
        return _result(argv, code, "".join(r.stdout for r in runs), "".join(r.stderr for r in runs))

    def _scancel(self, argv: list[str]) -> CommandResult:
        job = self.jobs.get(argv[-1])
        if job is not None and job.state in _ACTIVE:
            job.state, job.reason = "CANCELLED", "None"
        return _result(argv, 0, "")

    def _sinfo(self, argv: list[str]) -> CommandResult:
        if "-R" in argv:
            lines = [f"{node}|{why}" for node, why in self.node_reasons.items()]
            return _result(argv, 0, "".join(line + "\n" for line in lines))
        return _result(argv, 0, "".join(line + "\n" for line in self.partitions))

    def _visible(self) -> list[FakeJob]:
        return [j for j in self.jobs.values() if not j.forgotten]


_ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")


def _result(argv: Sequence[str], code: int, out: str, err: str = "") -> CommandResult:
    return CommandResult(tuple(argv), code, out, err)


class Hold:
    """A Slurm command kept in flight: ``arrived`` once it runs, answering once ``release()``d;
    ``after``: Slurm did the work first (an sbatch queued its job), only the answer is late.
    A caller cancelled meanwhile kills it there, as the real transport kills the command."""

    def __init__(self, after: bool) -> None:
        self.after = after
        self.arrived = asyncio.Event()
        self._released = asyncio.Event()
        self.count = 0  # commands that arrived

    def release(self) -> None:
        self._released.set()

    async def wait(self) -> None:
        self.count += 1
        self.arrived.set()
        await self._released.wait()


class FakeTransport(LocalTransport):
    """Local commands for real; Slurm's commands answered by a FakeSlurm."""

    def __init__(self, slurm: FakeSlurm, target: str = "fake") -> None:
        super().__init__()
        self.slurm = slurm
        self.target = target
        self.commands: list[tuple[str, ...]] = []
        # A Slurm command whose answer is lost: before it ran, or after it did its work.
        self.hang_before: str | None = None
        self.hang_after: str | None = None
        self.holds: dict[str, Hold] = {}

    def hold(self, command: str, *, after: bool = True) -> Hold:
        """Keep ``command`` (e.g. ``"sbatch"``) in flight from now on, until released."""
        self.holds[command] = Hold(after)
        return self.holds[command]

    async def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> CommandResult:
        self.commands.append(tuple(argv))
        slurm_argv = _slurm_argv(argv, self.slurm.user)
        if slurm_argv is None:
            return await super().run(argv, input=input, timeout=timeout, check=check)
        lost = TransportError(f"{slurm_argv[0]} did not finish within {timeout:g} s")
        if self.hang_before == slurm_argv[0]:
            raise lost
        hold = self.holds.get(slurm_argv[0])
        if hold is not None and not hold.after:
            await hold.wait()
        # the command line as run (e.g. sh -c ... sbatch SCRIPT), as a real transport reports
        result = replace(self.slurm.answer(slurm_argv, input), argv=tuple(argv))
        if hold is not None and hold.after:
            await hold.wait()
        if self.hang_after == slurm_argv[0]:
            raise lost
        return result.check() if check else result


def _slurm_argv(argv: Sequence[str], user: str = "alice") -> list[str] | None:
    if argv and argv[0] in SLURM_COMMANDS:
        return list(argv)
    # the package submits through a constant program: sh -c PROGRAM sbatch [SCRIPT] (without
    # SCRIPT, the script is on stdin)
    if len(argv) in (4, 5) and argv[:2] == ["sh", "-c"] and argv[3] == "sbatch":
        return ["sbatch", *argv[4:]]
    # ... and asks sacctmgr as the user: sh -c AS_THIS_USER NAME COMMAND... (adds user=NAME)
    if len(argv) > 4 and list(argv[:3]) == ["sh", "-c", AS_THIS_USER] and argv[4] in SLURM_COMMANDS:
        return [*argv[4:], f"user={user}"]
    return None
