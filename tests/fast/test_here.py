"""``--here``: Ray on the nodes of the allocation the kernel runs in, as steps of it. The
settings and their layers, the allocation read and checked before anything starts (every
refusal names its setting), the scheduler's ids and states, and a whole cluster on the scripted
Slurm with the real runner (a stand-in ``srun`` on PATH): up, down (the allocation left
running), the allocation's end."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jupyter_slurm_ray.config import SlurmRay, resolve_spec
from jupyter_slurm_ray.errors import ArgumentError, ExtendRefused, SpecError
from jupyter_slurm_ray.job.script import bootstrap_settings
from jupyter_slurm_ray.naming import allocation_of, is_here_job_id
from jupyter_slurm_ray.scheduler.records import JobInfo
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.hereplan import (
    choose_hosts,
    head_step,
    parse_allocation,
    plan_here,
    planned_spec,
)
from jupyter_slurm_ray.slurm.heresteps import HereSteps, StepRun, step_state
from jupyter_slurm_ray.slurm.schedulers import query_jobs, scheduler_of
from jupyter_slurm_ray.slurm.sitecheck import check_with_slurm
from jupyter_slurm_ray.slurm.usage import fetch_usage
from jupyter_slurm_ray.spec import ClusterSpec, ignored_by_mode
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import CommandResult
from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments
from jupyter_slurm_ray.ui.widget import ClusterPanel

from ..helpers.bootstrap import bootstrap_module
from ..helpers.fakeslurm import FakeJob, FakeSlurm, FakeTransport
from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import one_line_error
from ..helpers.waiting import until
from .conftest import emit, write_connection

ME = getpass.getuser()
OTHER = "carol" if ME == "bob" else "bob"  # another user, whoever runs the tests
ALLOCATION = (
    "JobId=77 JobName=notebook UserId={user}(1000) GroupId=g(1000) JobState={state} "
    "Reason=None TimeLimit=01:00:00 NodeList=node[1-3] BatchHost=node1 NumNodes=3 NumCPUs=6 "
    "TRES=cpu=6,mem=3G,node=3,gres/gpu=3 JOB_GRES=gpu:3 Nodes=node[1-2] CPU_IDs=0-1 Mem=1024 "
    "GRES=gpu:1(IDX:0) Nodes=node3 CPU_IDs=0 Mem=512 GRES=gpu:1(IDX:1) MinCPUsNode=1 "
    "Command=/home/x/notebook.sh"
)
# A stand-in srun: notes its arguments, environment and stdin (the job script) in the job dir,
# then stands for the step until a signal ends it (as scancel --signal does to the real one).
FAKE_SRUN = """#!/bin/sh
printf '%s\\n' "$@" >"$PWD/srun.args"
env >"$PWD/srun.env"
cat >"$PWD/step.script"
echo $$ >"$PWD/step.pid"
exec sleep 300
"""


@dataclass
class AllocationSlurm(FakeSlurm):
    """The fake Slurm with the details of allocations and their named steps."""

    details: dict[str, str] = field(default_factory=dict)  # job -> scontrol show job -d -o
    steps: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # job -> (step, name)
    step_pids: dict[str, int] = field(default_factory=dict)  # step -> the stand-in srun
    signalled: list[tuple[str, ...]] = field(default_factory=list)

    def _scontrol(self, argv: list[str]) -> CommandResult:
        if "-d" not in argv:
            return super()._scontrol(argv)
        line = self.details.get(argv[-1])
        if line is None:
            return CommandResult(tuple(argv), 1, "", "slurm_load_jobs error: Invalid job id")
        return CommandResult(tuple(argv), 0, line + "\n", "")

    def _squeue(self, argv: list[str]) -> CommandResult:
        if "--steps" not in argv:
            return super()._squeue(argv)
        job = self.jobs.get(argv[argv.index("-j") + 1])
        if job is None or job.state != "RUNNING":
            return CommandResult(tuple(argv), 1, "", "squeue: error: Invalid job id specified")
        lines = "".join(f"{step}|{name}\n" for step, name in self.steps.get(job.job_id, []))
        return CommandResult(tuple(argv), 0, lines, "")

    def _scancel(self, argv: list[str]) -> CommandResult:
        steps = [word for word in argv[1:] if "." in word]
        if not steps:
            return super()._scancel(argv)
        self.signalled.append(tuple(argv[1:]))
        number = signal.SIGUSR2 if "--signal=USR2" in argv else signal.SIGTERM
        for step in steps:
            os.kill(self.step_pids[step], number)
        return CommandResult(tuple(argv), 0, "", "")


@pytest.fixture
def slurm() -> AllocationSlurm:
    fake = AllocationSlurm()
    fake.details["77"] = ALLOCATION.format(user=ME, state="RUNNING")
    fake.jobs["77"] = FakeJob("77", "", name="notebook", state="RUNNING", nodes="node[1-3]")
    return fake


@pytest.fixture
def in_allocation(monkeypatch, tmp_path) -> Path:
    """This kernel in allocation 77 on node1, a stand-in srun on PATH, $HOME in tmp_path."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the runner's state dir
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


# -- the settings ---------------------------------------------------------------------------
def test_here_is_a_mode_whose_spec_needs_no_walltime() -> None:
    spec = ClusterSpec(mode="here")
    assert (spec.nodes, spec.here_nodes, spec.here_kernel_tasks) == (1, None, True)
    assert spec.require_complete() is spec


@pytest.mark.parametrize(
    ("field_name", "value"),
    [("time", "10"), ("partition", "debug"), ("account", "x"), ("nodes", 2), ("exclusive", True)],
)
def test_a_here_spec_refuses_what_only_sbatch_would_be_asked(field_name, value) -> None:
    with pytest.raises(SpecError) as error:
        ClusterSpec(mode="here", **{field_name: value})
    assert error.value.field == field_name and "mode 'here'" in str(error.value)


def test_the_configurations_slurm_request_is_left_out_with_here_and_said_so() -> None:
    environ = {"JUPYTER_SLURM_RAY_TIME": "1:00:00", "JUPYTER_SLURM_RAY_PARTITION": "short"}
    spec, sources = resolve_spec({"mode": "here", "nodes": 2}, environ=environ)
    assert (spec.time, spec.partition, spec.nodes) == (None, None, 1)
    notes = ignored_by_mode(sources)
    assert any(n.startswith("time: ") and "env JUPYTER_SLURM_RAY_TIME asked" in n for n in notes)
    assert any(n.startswith("partition: ") for n in notes)
    assert any(n.startswith("nodes: ") and "here_nodes" in n for n in notes)
    assert ignored_by_mode(resolve_spec({"time": "10"}, environ=environ)[1]) == []


@pytest.mark.parametrize(
    ("value", "kept"), [(2, "2"), ("03", "3"), ("node[2-3]", "node[2-3]"), ("n1,n2", "n1,n2")]
)
def test_here_nodes_is_a_count_or_a_host_list(value, kept) -> None:
    assert ClusterSpec(mode="here", here_nodes=value).here_nodes == kept


@pytest.mark.parametrize("value", ["0", "", "node[2-", "a b", "n1;rm", True])
def test_here_nodes_refuses_anything_else_naming_the_field(value) -> None:
    with pytest.raises(SpecError) as error:
        ClusterSpec(mode="here", here_nodes=value)
    assert error.value.field == "here_nodes"


def test_the_magics_here_options_set_the_mode_and_take_n_as_a_count() -> None:
    arguments = spec_arguments(parse("up --here -N 2"))
    assert (arguments["mode"], arguments["here_nodes"], arguments["nodes"]) == ("here", "2", None)
    listed = spec_arguments(parse("up --here --here-nodes node[2-3] --here-no-kernel-tasks"))
    assert listed["here_nodes"] == "node[2-3]" and listed["here_kernel_tasks"] is False
    assert spec_arguments(parse("up -t 10"))["here_kernel_tasks"] is None
    with pytest.raises(ArgumentError, match="not both"):
        spec_arguments(parse("up --here -N 2 --here-nodes node2"))
    with pytest.raises(ArgumentError, match="--local and --here"):
        spec_arguments(parse("up --here --local"))


def test_the_bootstrap_is_told_the_hosts_cpus_and_whether_the_head_runs_tasks() -> None:
    spec = ClusterSpec(mode="here", here_nodes="node[1-2]", nodes=2, cpus_per_node=2)
    settings = bootstrap_settings(spec.replace(here_kernel_tasks=False), "c-1")
    assert settings["here_hosts"] == ["node1", "node2"] and settings["cpus_per_node"] == 2
    assert settings["here_kernel_tasks"] is False and settings["walltime_warning"] == 120
    elsewhere = bootstrap_settings(ClusterSpec(time="10", cpus_per_node=2), "c-1")
    assert elsewhere["here_hosts"] == [] and elsewhere["cpus_per_node"] is None


# -- the allocation, read and checked -----------------------------------------------------------
def test_the_allocation_is_read_per_node_from_scontrol() -> None:
    allocation = parse_allocation(ALLOCATION.format(user="alice", state="RUNNING"))
    assert allocation is not None
    assert (allocation.job_id, allocation.user, allocation.state) == ("77", "alice", "RUNNING")
    assert [(n.host, n.cpus, n.mem_mb, n.gpus) for n in allocation.nodes] == [
        ("node1", 2, 1024, 1),
        ("node2", 2, 1024, 1),
        ("node3", 1, 512, 1),
    ]
    bare = parse_allocation("JobId=8 UserId=a(1) JobState=RUNNING NodeList=n[1-2] NumCPUs=8")
    assert bare is not None and [n.cpus for n in bare.nodes] == [4, 4]
    assert parse_allocation("") is None


def test_the_kernels_node_comes_first_then_the_allocations_order() -> None:
    allocation = parse_allocation(ALLOCATION.format(user="alice", state="RUNNING"))
    assert allocation is not None
    assert choose_hosts(allocation, None, "node2") == ("node2", "node1", "node3")
    assert choose_hosts(allocation, "2", "node3") == ("node3", "node1")
    assert choose_hosts(allocation, "node[2-3]", "node1") == ("node2", "node3")
    assert choose_hosts(allocation, None, "login1") == ("node1", "node2", "node3")  # salloc


async def test_outside_an_allocation_nothing_is_asked_and_mode_is_named(slurm) -> None:
    transport = FakeTransport(slurm)
    with pytest.raises(SpecError) as error:
        await plan_here(transport, ClusterSpec(mode="here"), environ={})
    assert error.value.field == "mode" and "SLURM_JOB_ID is not set" in str(error.value)
    assert "salloc" in str(error.value) and transport.commands == []


@pytest.mark.parametrize(
    ("allocation", "why"),
    [
        (ALLOCATION.format(user=OTHER, state="RUNNING"), f"belongs to {OTHER}, not to {ME}"),
        (ALLOCATION.format(user=ME, state="COMPLETING"), "job 77 is COMPLETING"),
        (None, "Slurm does not know job 77"),
    ],
)
async def test_an_allocation_not_yours_or_not_running_is_refused(slurm, allocation, why) -> None:
    if allocation is None:
        del slurm.details["77"]
    else:
        slurm.details["77"] = allocation
    with pytest.raises(SpecError) as error:
        await plan_here(FakeTransport(slurm), ClusterSpec(mode="here"), {"SLURM_JOB_ID": "77"})
    assert error.value.field == "mode" and why in str(error.value)


@pytest.mark.parametrize(
    ("settings", "field_name", "why"),
    [
        ({"here_nodes": "4"}, "here_nodes", "at most 3 nodes (allocation 77 has 3: node1, "),
        ({"here_nodes": "node[3-4]"}, "here_nodes", "not in it: node4"),
        ({"cpus_per_node": 2}, "cpus_per_node", "at most 1: allocation 77 holds 1 CPUs on node3"),
        ({"gpus_per_node": 2}, "gpus_per_node", "at most 1: allocation 77 holds 1 GPUs on node1"),
        ({"mem_per_node": "1G"}, "mem_per_node", "at most 512: allocation 77 holds 512 MB on"),
    ],
)
async def test_a_request_the_allocation_cannot_hold_is_refused_naming_the_field(
    slurm, settings, field_name, why
) -> None:
    environ = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node1"}
    with pytest.raises(SpecError) as error:
        await plan_here(FakeTransport(slurm), ClusterSpec(mode="here", **settings), environ)
    assert error.value.field == field_name and why in str(error.value)


async def test_the_plan_says_where_ray_runs_and_what_its_steps_get(slurm) -> None:
    environ = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node2"}
    spec = ClusterSpec(mode="here", here_nodes="node[1-2]", here_kernel_tasks=False)
    plan = await plan_here(FakeTransport(slurm), spec, environ)
    assert (plan.allocation, plan.hosts, plan.cpus, plan.head) == (
        "77",
        ("node2", "node1"),
        2,
        "node2",
    )
    notes = " ".join(plan.notes(spec))
    assert "allocation 77" in notes and "head node2 (this kernel's node)" in notes
    assert "runs Ray's head only: no tasks" in notes
    planned = planned_spec(spec, plan)
    assert (planned.nodes, planned.here_nodes, planned.cpus_per_node) == (2, "node2,node1", 2)
    step = head_step(plan, planned.replace(mem_per_node="512M", gpus_per_node=1))
    assert step.srun_options() == [
        "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node2", "--cpus-per-task=2",
        "--mem=512M", "--gres=gpu:1", "--kill-on-bad-exit=0",
    ]  # fmt: skip
    elsewhere = await plan_here(FakeTransport(slurm), spec, {"SLURM_JOB_ID": "77"})
    assert planned_spec(spec, elsewhere).here_kernel_tasks  # its head is not the kernel's node


async def test_the_site_check_of_here_reads_the_allocation_not_the_partitions(
    slurm, in_allocation
) -> None:
    checked = await check_with_slurm(ClusterSpec(mode="here"), FakeTransport(slurm))
    assert checked.partitions == [] and "--here: Ray in allocation 77" in checked.notes[0]
    assert [call[0] for call in slurm.calls] == ["scontrol"]  # no sinfo, no sacctmgr


# -- the scheduler: ids and states --------------------------------------------------------------
def test_a_here_step_id_is_never_a_slurm_job_id() -> None:
    assert is_here_job_id("here-77-4242") and allocation_of("here-77-4242") == "77"
    assert is_here_job_id("here-77_3-9") and allocation_of("here-77_3-9") == "77_3"
    assert not is_here_job_id("77") and not is_here_job_id("local-42")
    assert not is_here_job_id("here-77-x") and not is_here_job_id(None)
    assert isinstance(scheduler_of(FakeTransport(FakeSlurm()), "here-77-1"), HereSteps)
    assert type(scheduler_of(FakeTransport(FakeSlurm()), "77")) is SlurmClient


RUNNING_ALLOCATION = JobInfo("77", "RUNNING", nodes=("node1", "node2"), time_left=600)


def run(**fields) -> StepRun:
    values = dict(
        step_id="here-77-9", host="node1", started=1000.0, hosts=("node1", "node2"),
        comment="jupyter-slurm-ray:c-1", exit_code=None, cancelled=False, alive=True,
    )  # fmt: skip
    values.update(fields)
    return StepRun(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("step", "allocation", "listed", "state"),
    [
        (run(), RUNNING_ALLOCATION, None, "RUNNING"),
        (run(exit_code=0, cancelled=True), RUNNING_ALLOCATION, None, "CANCELLED"),
        (run(exit_code=0), RUNNING_ALLOCATION, None, "COMPLETED"),
        (run(exit_code=3), RUNNING_ALLOCATION, None, "FAILED"),
        (run(exit_code=137), JobInfo("77", "COMPLETING"), None, "COMPLETING"),
        (run(exit_code=143), JobInfo("77", "TIMEOUT"), None, "TIMEOUT"),
        (run(), JobInfo("77", "CANCELLED"), None, "CANCELLED"),
        (run(alive=None), RUNNING_ALLOCATION, True, "RUNNING"),  # seen from another host
        (run(alive=None), RUNNING_ALLOCATION, False, "FAILED"),
        (run(alive=None, started=1990.0), RUNNING_ALLOCATION, False, "RUNNING"),  # starting
        (None, RUNNING_ALLOCATION, True, "RUNNING"),  # no runner files here
        (None, RUNNING_ALLOCATION, False, None),
        (run(), None, None, None),  # Slurm forgot the allocation: no news
    ],
)
def test_the_heads_step_state_combines_its_runner_and_the_allocation(
    step, allocation, listed, state
) -> None:
    info = step_state("here-77-9", step, allocation, listed, now=2000.0)
    assert (info.state if info else None) == state


def test_a_running_step_has_the_allocations_time_left_and_its_own_nodes() -> None:
    info = step_state("here-77-9", run(), RUNNING_ALLOCATION, None, now=2000.0)
    assert info is not None and info.time_left == 600 and info.nodes == ("node1", "node2")
    assert info.comment == "jupyter-slurm-ray:c-1"  # its cluster's tag, as Slurm shows a job's
    ended = step_state("here-77-9", run(), JobInfo("77", "CANCELLED"), None, now=2000.0)
    assert ended is not None and ended.reason == "allocation 77 ended CANCELLED"


async def test_extend_and_usage_of_a_here_cluster_point_at_its_allocation(slurm) -> None:
    with pytest.raises(ExtendRefused, match="scontrol update JobId=77"):
        await HereSteps(FakeTransport(slurm)).extend("here-77-9", 30)
    usage = await fetch_usage(FakeTransport(slurm), ["here-77-9"])
    assert usage.unavailable is not None and "allocation 77" in usage.unavailable


# -- a whole cluster, the runner for real -------------------------------------------------------
@pytest.fixture
async def here_cluster(make_cluster, slurm, in_allocation, transport):
    """A --here cluster started in allocation 77 (its stand-in step running)."""
    started: list = []

    async def start(**spec):
        cluster = make_cluster(mode="here", time=None, **spec)
        await cluster.up_async(wait=False)
        job_dir = Path(cluster.job_dir)
        pid = int(await until(lambda: _read(job_dir / "step.pid"), 10, "the step"))
        step = f"77.{len(started)}"
        slurm.steps.setdefault("77", []).append((step, cluster.job_id))
        slurm.step_pids[step] = pid
        started.append(pid)
        return cluster

    yield start
    for pid in started:
        with pytest.raises(ProcessLookupError):
            for _ in range(100):  # the stand-in steps are gone, or are ended here
                os.kill(pid, signal.SIGKILL)
                await asyncio.sleep(0.05)


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


async def test_up_here_runs_the_job_script_as_a_step_of_the_allocation(here_cluster, slurm) -> None:
    cluster = await here_cluster(cpus_per_node=1)
    assert is_here_job_id(cluster.job_id) and allocation_of(cluster.job_id) == "77"
    assert (cluster.spec.nodes, cluster.spec.here_nodes) == (3, "node1,node2,node3")
    job_dir = Path(cluster.job_dir)
    args = (job_dir / "srun.args").read_text().splitlines()
    assert args[:4] == ["--jobid=77", f"--job-name={cluster.job_id}", args[2], f"--chdir={job_dir}"]
    assert args[2].startswith("--export=") and args[2].endswith(",JSR_JOB_ID")
    assert "--overlap" in args and "--nodelist=node1" in args and "--cpus-per-task=1" in args
    assert args[-2:] == ["bash", "-s"]  # the script comes on stdin, as submitted
    assert (job_dir / "step.script").read_text() == (job_dir / "job.sbatch").read_text()
    assert f"JSR_JOB_ID={cluster.job_id}" in (job_dir / "srun.env").read_text()
    assert "SLURM_JOB_ID" not in (job_dir / "srun.env").read_text()  # only --jobid names it
    await until(lambda: cluster.state is State.STARTING, 5, "STARTING")
    write_connection(cluster)
    emit(cluster, {"event": "ready", "joined": 3, "node_count": 3})
    await until(lambda: cluster.state is State.READY, 5, "READY")
    record = cluster.registry.load(cluster.id)
    assert record.job_id == cluster.job_id and record.spec["mode"] == "here"
    assert record.nodes_wanted == 3 and cluster.status.time_left is not None


async def test_down_stops_the_steps_and_leaves_the_allocation_running(here_cluster, slurm) -> None:
    cluster = await here_cluster()
    await until(lambda: cluster.state is State.STARTING, 5, "STARTING")
    status = await cluster.down_async(timeout=10)
    assert status.state is State.STOPPED, status
    assert slurm.signalled == [("--signal=USR2", "77.0")]  # the bootstrap stops its Ray
    assert slurm.jobs["77"].state == "RUNNING"  # the allocation, the notebook's, runs on
    with pytest.raises(SpecError):  # a here cluster has its allocation's nodes: no scaling
        cluster.elastic.checked_scale(4)


async def test_the_allocations_end_ends_the_cluster_with_its_state(here_cluster, slurm) -> None:
    cluster = await here_cluster()
    await until(lambda: cluster.state is State.STARTING, 5, "STARTING")
    slurm.end("77", "CANCELLED")  # scancel of the allocation: Slurm ends its steps too
    os.kill(slurm.step_pids["77.0"], signal.SIGTERM)
    await until(lambda: cluster.state.is_final, 10, "the end")
    assert cluster.state is State.CANCELLED and cluster.registry.load(cluster.id).is_final


async def test_a_step_seen_from_another_host_is_looked_up_by_name(here_cluster, slurm) -> None:
    cluster = await here_cluster()
    here = HereSteps(cluster.transport)
    start = Path(os.environ["HOME"], ".jupyter-slurm-ray", "here-steps", f"{cluster.job_id}.start")
    lines = start.read_text().splitlines()
    lines[1] = lines[1].split()[0] + " elsewhere"  # as if its runner ran on another host
    start.write_text("\n".join(lines) + "\n")
    info = (await query_jobs(SlurmClient(cluster.transport), [cluster.job_id]))[cluster.job_id]
    assert info.state == "RUNNING" and info.nodes == ("node1", "node2", "node3")
    assert any("--steps" in call for call in slurm.calls)
    slurm.steps["77"] = []
    later = (await here.query([cluster.job_id]))[cluster.job_id]
    assert later.state == "RUNNING"  # within the grace a new step has to show in Slurm


# -- the bootstrap, as the allocation's steps --------------------------------------------------
def test_the_worker_step_runs_on_the_clusters_other_nodes_named_as_the_heads(
    tmp_path: Path, monkeypatch
) -> None:
    headrun = bootstrap_module("headrun")
    jsr_base = bootstrap_module("jsr_base")
    monkeypatch.setenv("JSR_JOB_ID", "here-77-9")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    assert jsr_base.job_id() == "here-77-9"  # not the allocation's: its temp dirs, its ports
    head = headrun.HeadRun.__new__(headrun.HeadRun)  # only its settings are used
    head.config = jsr_base.Config(cluster_id="c-1", here_hosts=["node2", "node1", "node3"])
    head.config.cpus_per_node = 2
    here = head.here_workers()
    assert here.hosts == ("node1", "node3") and here.name == "here-77-9" and here.cpus == 2
    workerstep = bootstrap_module("workerstep")
    argv = workerstep.worker_step_argv("srun", tmp_path, 2, {"SLURMD_NODENAME": "node2"}, here)
    assert "--nodelist=node1,node3" in argv and "--job-name=here-77-9" in argv
    assert "--cpus-per-task=2" in argv and not any(a.startswith("--exclude") for a in argv)
    head.config = jsr_base.Config(cluster_id="c-1")
    assert head.here_workers() is None  # a job of its own: every other node of the job


def test_the_worker_step_of_a_here_head_asks_slurm_for_the_allocations_shape(monkeypatch) -> None:
    # Inside the head's one-node step these describe that step: a nested srun read them as
    # the allocation and refused ("Only allocated 1 nodes asked for 2", seen on the testbed).
    workerstep = bootstrap_module("workerstep")
    step = {"SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1"}
    for name, value in {**step, "SLURM_JOB_ID": "77", "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}.items():
        monkeypatch.setenv(name, value)
    here = workerstep.worker_step_environment(here=True)
    assert not set(step) & set(here)
    assert (here["SLURM_JOB_ID"], here["SLURM_JOB_CPUS_PER_NODE"]) == ("77", "2(x3)")
    own = workerstep.worker_step_environment(here=False)  # a job of its own: its batch step's
    assert all(own[name] == value for name, value in step.items())


def test_the_head_warns_before_the_allocations_end_which_it_asks_of_squeue(
    tmp_path: Path, monkeypatch
) -> None:
    allocationend = bootstrap_module("allocationend")
    squeue = tmp_path / "squeue"
    squeue.write_text(f'#!/bin/sh\necho "$@" >{tmp_path}/asked\ncat {tmp_path}/end\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "end").write_text("2999-01-01T00:00:00\n")
    end = allocationend.AllocationEnd("77", 120.0)
    assert not end.warning_due() and (tmp_path / "asked").read_text().split() == [
        "-h", "-j", "77", "-o", "%e",
    ]  # fmt: skip
    soon = allocationend.datetime.fromtimestamp(allocationend.time.time() + 60)
    (tmp_path / "end").write_text(soon.isoformat(timespec="seconds") + "\n")
    end.next_check = 0.0
    assert end.warning_due() and not end.warning_due()  # once per end time
    (tmp_path / "end").write_text("Unknown\n")
    end.next_check = 0.0
    assert not end.warning_due()


# -- the entry points: magic, panel, REST ------------------------------------------------------
def test_the_magic_refuses_here_outside_an_allocation_in_one_line(magic, slurm, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    out, err, _ = magic.run("%slurm_ray up --here")
    assert "note: time: ignored with mode 'here'" in out  # the testbed profile's walltime
    line = one_line_error(err)
    assert line.startswith("UsageError: mode: 'here' is not allowed") and "SLURM_JOB_ID" in line
    assert slurm.calls == [] and slurm.jobs.keys() == {"77"}  # nothing asked, nothing submitted


def test_the_magic_refuses_more_nodes_than_the_allocation_before_anything_starts(
    magic, slurm, in_allocation
):
    _, err, _ = magic.run("%slurm_ray up --here -N 4")
    assert "here_nodes: '4' is not allowed; at most 3 nodes" in one_line_error(err)
    assert [call[0] for call in slurm.calls] == ["scontrol"] and slurm.jobs.keys() == {"77"}
    assert not (in_allocation / "home" / ".jupyter-slurm-ray" / "here-steps").exists()


def test_the_panel_offers_here_only_inside_an_allocation(site, slurm, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    panel = ClusterPanel(session=Session(SlurmRay()))
    try:
        assert panel.here.layout.display == "none"
    finally:
        panel.close()
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    panel = ClusterPanel(session=Session(SlurmRay()))
    try:
        assert panel.here.layout.display == ""
        panel.here.value = True
        assert panel.walltime.disabled and panel.partition.disabled and panel.nodes.value == 3
        panel.nodes.value = 2
        spec = panel.spec()
        assert (spec.mode, spec.here_nodes, spec.time, spec.partition) == ("here", "2", None, None)
    finally:
        panel.close()


async def test_rest_post_here_outside_an_allocation_is_a_400_naming_mode(
    jp_fetch, server_manager, slurm, monkeypatch
):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    body = json.dumps({"mode": "here", "here_nodes": "2"})
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", method="POST", body=body, raise_error=False
    )
    answer = json.loads(response.body)
    assert response.code == 400 and answer["field"] == "mode", answer
    assert slurm.calls == [] and server_manager.registry.all() == []
