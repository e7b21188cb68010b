"""Every parser of Slurm's output, on the real output of every Slurm release the testbed has
(``tests/resources/slurm-output/<version>/``, written by ``scripts/capture-slurm-output``): the
jobs there are in known states (completed, failed, cancelled, timed out, out of memory, running
on two nodes with a GPU and a named step, pending, held), so each parsed field is checked, not
only that it parses. The SlurmClient runs against a transport that answers each command with
what that release printed (a job list narrowed to the jobs asked about, as Slurm does)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap import slurmenv
from jupyter_slurm_ray.errors import CommandError, ExtendRefused
from jupyter_slurm_ray.slurm.client import (
    AS_THIS_USER,
    SlurmClient,
    _invalid_job_id,
    _no_controller,
    _slurm_message,
)
from jupyter_slurm_ray.slurm.hereplan import parse_allocation
from jupyter_slurm_ray.slurm.heresteps import HereSteps
from jupyter_slurm_ray.slurm.output import parse_sacct, parse_scontrol_job, parse_squeue_line
from jupyter_slurm_ray.transport import CommandResult, Transport

from ..helpers.bootstrap import bootstrap_module
from ..helpers.paths import REPO

RESOURCES = REPO / "tests" / "resources" / "slurm-output"
RELEASES = sorted(path.parent for path in RESOURCES.glob("*/manifest.json"))

#: How each job ended, as every release says it (state, exit code).
ENDED = {
    "completed": ("COMPLETED", 0),
    "failed": ("FAILED", 3),
    "cancelled": ("CANCELLED", 0),  # accounting keeps the batch script's 0:0, not the signal
    "timeout": ("TIMEOUT", 0),
}
OOM = "OUT_OF_MEMORY"  # under an enforced profile only (a memory cgroup killed the job)
#: scontrol keeps the signal that ended the batch script (0:15), accounting the job's 0:0.
SCONTROL_CODES = {"cancelled": 128 + 15, "timeout": 128 + 15}


@dataclass(frozen=True)
class Release:
    path: Path
    manifest: dict

    @property
    def version(self) -> str:
        return self.manifest["slurm_version"]

    def out(self, name: str) -> str:
        path = self.path / f"{name}.out"
        return path.read_text() if path.exists() else ""

    def err(self, name: str) -> str:
        path = self.path / f"{name}.err"
        return path.read_text() if path.exists() else ""

    def exit(self, name: str) -> int:
        return self.manifest["commands"][name]["exit"]

    def job(self, role: str) -> str:
        return self.manifest["jobs"][role]

    def ended(self) -> dict[str, tuple[str, int]]:
        """The roles of the jobs that ended, with how they ended."""
        if "oom" in self.manifest["jobs"]:
            return {**ENDED, "oom": (OOM, 253)}  # sacct's 0:125 is read as a signal: 128 + 125
        return dict(ENDED)


@pytest.fixture(params=RELEASES, ids=[path.name for path in RELEASES])
def release(request) -> Release:
    return Release(request.param, json.loads((request.param / "manifest.json").read_text()))


def test_there_is_output_of_each_release_the_testbed_has():
    assert {path.name.rsplit(".", 1)[0] for path in RELEASES} >= {"22.05", "24.11", "26.05"}


class Recorded(Transport):
    """A transport answering each Slurm command with what one release printed for it. A
    command with other job ids than the captured one (``-j``) gets the captured lines of those
    jobs only; ``sh -c AS_THIS_USER`` runs as the captured user."""

    target = "recorded"

    def __init__(self, release: Release) -> None:
        super().__init__()
        self.release = release
        self.asked: list[list[str]] = []

    async def _execute(self, argv, input, timeout) -> CommandResult:
        self.asked.append(argv)
        if argv[:3] == ["sh", "-c", AS_THIS_USER]:
            argv = [*argv[4:], f"user={self.release.manifest['user']}"]
        elif argv[:2] == ["sh", "-c"] and argv[3:] == ["sbatch"]:  # a job script on stdin
            return self._answer(argv, "sbatch-parsable")
        commands = self.release.manifest["commands"]
        for name, command in commands.items():
            if command["argv"] == argv:
                return self._answer(argv, name)
        for name, command in commands.items():
            wanted = _jobs_asked(argv, command["argv"])
            if wanted is not None:
                answer = self._answer(argv, name)
                lines = [
                    line
                    for line in answer.stdout.splitlines(keepends=True)
                    if line.split("|")[0].split(".")[0] in wanted
                ]
                return CommandResult(tuple(argv), answer.returncode, "".join(lines), "")
        raise AssertionError(f"{self.release.version} has no capture of {argv}")

    def _answer(self, argv: list[str], name: str) -> CommandResult:
        release = self.release
        return CommandResult(tuple(argv), release.exit(name), release.out(name), release.err(name))

    async def forward(self, remote_host, remote_port):
        raise NotImplementedError


def _jobs_asked(argv: list[str], captured: list[str]) -> set[str] | None:
    """The job ids ``argv`` asks for when it is ``captured`` but for a ``-j`` list that is part
    of the captured one."""
    if "-j" not in argv or len(argv) != len(captured):
        return None
    at = argv.index("-j") + 1
    if argv[:at] + argv[at + 1 :] != captured[:at] + captured[at + 1 :]:
        return None
    wanted = set(argv[at].split(","))
    return wanted if wanted <= set(captured[at].split(",")) else None


# -- squeue, sacct, scontrol: the states of jobs ------------------------------------------------
def test_an_ended_jobs_state_is_read_from_squeue_while_slurm_remembers_it(release):
    for role, (state, _) in release.ended().items():
        info = parse_squeue_line(release.out(f"squeue-job-{role}").strip())
        assert info is not None and info.job_id == release.job(role), role
        assert (info.state, info.is_final, info.name) == (state, True, f"jsr-{role}"), role
        assert info.node_count == 1 and len(info.nodes) == 1, role


def test_a_running_and_pending_jobs_are_read_from_squeue(release):
    infos = {
        info.job_id: info
        for line in release.out("squeue-jobs").splitlines()
        if (info := parse_squeue_line(line))
    }
    running = infos[release.job("running")]
    assert running.is_running and running.node_count == 2 and len(set(running.nodes)) == 2
    assert running.comment == "jupyter-slurm-ray:capture" and running.reason is None
    assert running.time_limit == 1800 and 0 < running.time_left <= 1800
    assert isinstance(running.start_time, datetime)
    pending, held = infos[release.job("pending")], infos[release.job("held")]
    assert pending.is_pending and pending.nodes == () and pending.reason == "BeginTime"
    assert held.is_pending and held.reason == "JobHeldUser"
    timed_out = infos[release.job("timeout")]
    assert (timed_out.state, timed_out.time_left, timed_out.time_limit) == ("TIMEOUT", None, 60)


@pytest.mark.parametrize("capture", ["sacct", "sacct-jobcomp"])
def test_sacct_and_the_jobcomp_file_give_the_final_state_and_exit_code(release, capture):
    infos = parse_sacct(release.out(capture))
    for role, (state, code) in release.ended().items():
        info = infos[release.job(role)]
        assert (info.state, info.exit_code, info.name) == (state, code, f"jsr-{role}"), role
        assert info.source == "sacct" and len(info.nodes) == 1, role
    assert infos[release.job("completed")].time_limit == 300
    assert infos[release.job("timeout")].time_limit == 60


def test_scontrol_describes_each_ended_job(release):
    for role, (state, code) in release.ended().items():
        info = parse_scontrol_job(release.out(f"scontrol-job-{role}"))
        assert info is not None, role
        assert (info.job_id, info.state, info.name) == (release.job(role), state, f"jsr-{role}")
        assert info.exit_code == SCONTROL_CODES.get(role, code) and len(info.nodes) == 1, role
    running = parse_scontrol_job(release.out("scontrol-job-running"))
    assert running is not None and running.state == "RUNNING" and len(running.nodes) == 2
    assert running.time_limit == 1800


async def test_one_query_gives_every_jobs_state_from_squeue_then_accounting(release):
    client = SlurmClient(Recorded(release))
    infos = await client.query(release.manifest["jobs"].values())
    for role, (state, code) in release.ended().items():
        assert (infos[release.job(role)].state, infos[release.job(role)].exit_code) == (
            state,
            code,
        ), role
    assert infos[release.job("running")].is_running
    assert infos[release.job("pending")].is_pending
    assert infos[release.job("held")].reason == "JobHeldUser"


async def test_the_users_tagged_jobs_and_their_directories(release):
    client = SlurmClient(Recorded(release))
    assert await client.tagged_jobs() == {release.job("running"): "capture"}
    dirs = await client.work_dirs()
    assert set(dirs) >= {release.job("running"), release.job("pending")}
    assert all(directory.startswith("/") for directory in dirs.values())


def test_more_nodes_than_the_partition_has_is_queued_or_refused_as_each_release_does(release):
    """22.05 and 26.05 queue such a job, PENDING (PartitionNodeLimit) for ever; 24.11 refuses
    it at submit (EnforcePartLimits=NO in all three)."""
    name = "sbatch-more-nodes-than-the-partition"
    if release.version.startswith(("22.05.", "26.05.")):
        assert release.exit(name) == 0 and release.out(name).strip().isdigit()
    else:
        assert release.exit(name) == 1
        assert "Requested node configuration is not available" in release.err(name)


async def test_a_submitted_jobs_id(release):
    assert (await SlurmClient(Recorded(release)).submit("#!/bin/sh\ntrue\n")).isdigit()


# -- sinfo and sacctmgr: what the widget and the site checks read ---------------------------
async def test_the_partitions_for_the_widget(release):
    partitions = {p.name: p for p in await SlurmClient(Recorded(release)).partitions()}
    assert set(partitions) == {"debug", "short", "solo", "solo-short"}
    debug, short, solo = partitions["debug"], partitions["short"], partitions["solo"]
    assert debug.is_default and not short.is_default and debug.available
    assert (debug.total_nodes, debug.cpus_per_node, debug.gpus_per_node) == (3, 4, 2)
    assert debug.memory_mb > 1000 and debug.max_time is None and debug.max_nodes is None
    assert (short.max_time, short.max_nodes) == (1800, 2)
    assert (solo.total_nodes, solo.cpus_per_node, solo.idle_nodes) == (3, 2, 3)


async def test_a_drained_nodes_reason(release):
    node = release.manifest["drained_node"]
    reasons = await SlurmClient(Recorded(release)).node_reasons([node])
    assert reasons == {node: "jsr capture drill"}


async def test_the_users_associations_and_the_qoses(release):
    client = SlurmClient(Recorded(release))
    (association,) = await client.associations()
    assert (association.user, association.account, association.default_account) == (
        release.manifest["user"],
        "physics",
        "physics",
    )
    assert association.qos == ("normal", "short") and association.default_qos == "normal"
    qos = await client.qos()
    assert qos["short"].max_wall == 600 and qos["short"].max_tres_per_job == {"node": "1"}
    assert "DenyOnLimit" in qos["short"].flags and qos["normal"].max_wall is None


async def test_the_usage_of_allocations_and_their_steps(release):
    ids = list(release.manifest["jobs"].values())
    rows = await SlurmClient(Recorded(release)).usage(ids)
    running = release.job("running")
    allocation = next(r for r in rows if r.job_id == running)
    assert allocation.step is None and allocation.alloc_cpus == 4 and len(allocation.nodes) == 2
    assert allocation.alloc_tres["gres/gpu"] == "2" and allocation.alloc_tres["node"] == "2"
    steps = {r.step for r in rows if r.allocation == running}
    assert {"batch", "0"} <= steps
    completed = [r for r in rows if r.allocation == release.job("completed")]
    assert {r.state for r in completed} == {"COMPLETED"} and completed[0].elapsed >= 1
    measured = [r.max_rss for r in rows if r.step == "batch" and r.max_rss is not None]
    assert measured and all(size >= 0 for size in measured)  # bytes (--noconvert)
    if "oom" in release.manifest["jobs"]:
        assert {r.state for r in rows if r.allocation == release.job("oom") and r.step} >= {OOM}


# -- --here: an allocation's details and steps; the bootstrap's own questions -----------------
def test_an_allocations_nodes_cpus_memory_and_gpus(release):
    allocation = parse_allocation(release.out("scontrol-job-detail"))
    assert allocation is not None and allocation.job_id == release.job("running")
    assert allocation.state == "RUNNING" and allocation.user == release.manifest["user"]
    assert len(allocation.nodes) == 2
    for node in allocation.nodes:
        assert (node.cpus, node.mem_mb, node.gpus) == (2, 300, 1), node


async def test_a_named_step_of_an_allocation(release):
    steps = await HereSteps(Recorded(release))._named_steps(
        release.job("running"), "jsr-named-step"
    )
    assert steps is not None and len(steps) == 1
    assert steps[0].startswith(release.job("running") + ".")


def _fake_command(directory: Path, name: str, output: str) -> None:
    (directory / f"{name}.txt").write_text(output)
    path = directory / name
    path.write_text(f"#!/bin/sh\ncat {directory / name}.txt\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_bootstrap_reads_the_allocations_end_and_the_controllers_address(
    release, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    _fake_command(tmp_path, "squeue", release.out("squeue-end"))
    _fake_command(tmp_path, "scontrol", release.out("scontrol-config"))
    end = bootstrap_module("allocationend").allocation_end(release.job("running"))
    assert end is not None and end > datetime(2026, 1, 1).timestamp()
    assert bootstrap_module("nodeaddr").slurmctld_address() == release.manifest["controller"]


# -- what Slurm's commands say when they refuse or cannot reach the controller ----------------
def test_an_unreachable_controller_is_told_from_a_refusal(release):
    for name in (
        "squeue-controller-paused",
        "squeue-controller-gone",
        "sbatch-controller-paused",
        "sbatch-controller-gone",
    ):
        assert release.exit(name) != 0 and _no_controller(release.err(name)), name
    for name in (
        "sbatch-no-partition",
        "sbatch-qos-limit",
        "sbatch-wrong-account",
        "scontrol-extend",
    ):
        assert release.exit(name) != 0 and not _no_controller(release.err(name)), name


def test_a_refusal_is_told_in_slurms_words(release):
    said = {
        name: _slurm_message(CommandError(["sbatch"], 1, "", release.err(name)))
        for name in ("sbatch-no-partition", "sbatch-qos-limit", "sbatch-wrong-account")
    }
    assert "nosuch" in said["sbatch-no-partition"] or "partition" in said["sbatch-no-partition"]
    assert "QOS" in said["sbatch-qos-limit"]
    assert "account" in said["sbatch-wrong-account"].lower()
    assert not any("error:" in words for words in said.values())


async def test_extending_a_job_is_refused_in_slurms_words(release):
    with pytest.raises(ExtendRefused, match=r"scontrol failed: .*(denied|not permitted)"):
        await SlurmClient(Recorded(release)).extend(release.job("running"), 5)


def test_a_job_slurm_does_not_know_is_told_apart(release):
    assert _invalid_job_id(release.err("squeue-missing")) and release.exit("squeue-missing") == 1
    assert _invalid_job_id(release.err("scontrol-job-missing"))


def test_sbatch_says_its_release(release):
    first = release.out("sbatch-version").splitlines()[0]
    assert first.startswith("slurm") and first.endswith(release.version)


# -- a batch job's environment ------------------------------------------------------------------
def _names(text: str) -> set[str]:
    return {line.partition("=")[0] for line in text.splitlines() if "=" in line}


def test_a_batch_jobs_own_variables_stay_inside_the_cluster_job(release):
    """Inside its own job the bootstrap removes only input variables Slurm never sets for a
    batch job (slurmenv.FOREIGN_IN_A_JOB): none of what this release set for one."""
    batch = _names(release.out("batch-env"))
    assert {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_MEM_PER_NODE"} <= batch
    assert not batch & slurmenv.FOREIGN_IN_A_JOB
    assert all(not slurmenv.is_slurm_input(name, in_own_job=True) for name in batch)


def test_outside_a_job_no_variable_of_a_job_or_its_step_reaches_slurm(release):
    for name in _names(release.out("batch-env")) | _names(release.out("step-env")):
        kept = name in slurmenv.KEPT
        assert slurmenv.is_slurm_input(name, in_own_job=False) is not kept, name


def test_the_capture_is_of_the_release_it_names(release):
    assert release.path.name == release.version
    assert release.manifest["package"].startswith("slurm-client ")
    assert all(job.isdigit() for job in release.manifest["jobs"].values())
