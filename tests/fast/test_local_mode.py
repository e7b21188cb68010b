"""Local mode without Ray: the setting and its layers, the scheduler chosen by the transport,
the error when no Slurm answers, and LocalJobs' runner for real (bash, a tiny job script that
stands for the bootstrap): submit, RUNNING, the walltime warning, TIMEOUT, cancel, exit codes."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SlurmRay, resolve_spec
from jupyter_slurm_ray.errors import ExtendRefused, SlurmUnavailable, SpecError
from jupyter_slurm_ray.job.script import render_job_script
from jupyter_slurm_ray.registry import ClusterRecord, Registry
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.slurm.localjobs import (
    LocalJobs,
    is_local_job_id,
    job_limits,
    parse_local_line,
)
from jupyter_slurm_ray.slurm.schedulers import scheduler_for_mode, scheduler_of
from jupyter_slurm_ray.slurm.sitecheck import check_with_slurm
from jupyter_slurm_ray.slurm.usage import fetch_usage
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.targets import Transports
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.magic_args import parse, spec_arguments
from jupyter_slurm_ray.ui.widget import ClusterPanel


# -- the setting ----------------------------------------------------------------------------
def test_mode_is_slurm_unless_local_is_asked() -> None:
    assert ClusterSpec().mode == "slurm"
    assert ClusterSpec(mode="local").mode == "local"


def test_an_unknown_mode_names_the_field_and_what_is_allowed() -> None:
    with pytest.raises(SpecError) as error:
        ClusterSpec(mode="laptop")
    assert error.value.field == "mode"
    assert "'slurm', 'local'" in str(error.value)


def test_mode_comes_from_the_environment_like_every_setting() -> None:
    spec, sources = resolve_spec(environ={"JUPYTER_SLURM_RAY_MODE": "local"})
    assert spec.mode == "local"
    assert sources["mode"] == "env JUPYTER_SLURM_RAY_MODE"


def test_local_mode_runs_one_node_and_says_where_the_asked_number_went() -> None:
    spec, sources = resolve_spec({"nodes": "2"}, environ={"JUPYTER_SLURM_RAY_MODE": "local"})
    assert spec.nodes == 1
    assert "local mode runs one node" in sources["nodes"] and "asked 2" in sources["nodes"]


def test_a_local_spec_of_several_nodes_is_refused_when_built_directly() -> None:
    with pytest.raises(SpecError) as error:
        ClusterSpec(mode="local", nodes=3)
    assert error.value.field == "nodes" and "local mode" in str(error.value)


@pytest.mark.parametrize("subcommand", ["up", "script", "config"])
def test_the_local_option_sets_the_mode(subcommand: str) -> None:
    assert spec_arguments(parse(f"{subcommand} --local -t 10"))["mode"] == "local"
    assert spec_arguments(parse(f"{subcommand} -t 10"))["mode"] is None


# -- where it runs and who schedules it -------------------------------------------------------
def test_local_mode_runs_on_this_machine_and_its_scheduler_is_chosen_by_mode_or_job_id() -> None:
    configured = LocalTransport(["env"])
    transports = Transports(lambda: configured)
    local = transports.for_target("local mode (env)")  # a local-mode cluster's record
    assert local is configured.for_local_mode() is configured  # where: this machine
    assert transports.for_target("local (env)") is configured
    assert transports.reaches("local mode (env)") and not transports.reaches("local mode")
    assert isinstance(scheduler_for_mode("local", local), LocalJobs)  # who: the mode's
    assert type(scheduler_for_mode("slurm", configured)) is SlurmClient
    assert isinstance(scheduler_of(configured, "local-42"), LocalJobs)  # or the job id's
    assert type(scheduler_of(configured, "42")) is SlurmClient


def test_a_local_job_id_is_kept_in_a_record(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "state")
    record = ClusterRecord(
        id="ray-0badf00d", name="ray", target="local mode", job_dir="/j", job_id="local-42"
    )
    registry.save(record)
    assert registry.load("ray-0badf00d").job_id == "local-42"
    assert is_local_job_id("local-42") and not is_local_job_id("42")


async def test_local_mode_asks_slurm_nothing_before_it_starts() -> None:
    nowhere = LocalTransport(["/nonexistent/slurm-wrapper"])
    checked = await check_with_slurm(ClusterSpec(mode="local", time="10"), nowhere)
    assert checked.partitions == [] and "local mode" in checked.notes[0]


async def test_without_slurm_the_error_suggests_local_mode() -> None:
    nowhere = LocalTransport(["/nonexistent/slurm-wrapper"])  # no Slurm command can run
    with pytest.raises(SlurmUnavailable) as error:
        await check_with_slurm(ClusterSpec(time="10"), nowhere)
    assert "--local" in str(error.value) and 'mode = "local"' in str(error.value)


# -- what the runner is given and what the query says -----------------------------------------
def test_the_runner_reads_the_limits_from_the_sbatch_lines_as_sbatch_would() -> None:
    spec = ClusterSpec(mode="local", time="1:30:00", cpus_per_node=2, mem_per_node="3G")
    script = render_job_script(spec, cluster_id="ray-0badf00d", job_dir="/j/d", command=["true"])
    assert job_limits(script) == {
        "limit": "5400",
        "warning": "120",
        "cpus": "2",
        "mem": "3072",
        "chdir": "/j/d",
        "export": "NONE",
    }
    bare = render_job_script(
        ClusterSpec(time="5"), cluster_id="ray-0badf00d", job_dir="/j", command=["true"]
    )
    assert job_limits(bare)["cpus"] == "" and job_limits(bare)["mem"] == ""


def test_a_runner_still_running_is_running_and_a_vanished_one_failed() -> None:
    stamp = "Tue Dec  1 04:22:28 2026"
    running = parse_local_line(f"local-7|{stamp}|{stamp}|1796098948 600 vm|")
    assert running is not None and running.state == "RUNNING" and running.nodes == ("vm",)
    assert running.time_limit == 600
    gone = parse_local_line(f"local-7||{stamp}|1796098948 600 vm|")
    assert gone is not None and gone.state == "FAILED" and "runner" in (gone.reason or "")
    ended = parse_local_line(f"local-7||{stamp}|1796098948 600 vm|TIMEOUT 143 1796099000")
    assert ended is not None and ended.state == "TIMEOUT" and ended.exit_code == 143
    assert parse_local_line("7|x|y|z") is None


def test_an_exit_status_older_than_the_job_is_an_earlier_job_of_the_same_pid() -> None:
    stamp = "Tue Dec  1 04:22:28 2026"
    earlier = "CANCELLED 0 1796098000"  # pids wrap: a job of the same pid, hours before
    running = parse_local_line(f"local-7|{stamp}|{stamp}|1796098948 600 vm|{earlier}")
    assert running is not None and running.state == "RUNNING"
    gone = parse_local_line(f"local-7||{stamp}|1796098948 600 vm|{earlier}")
    assert gone is not None and gone.state == "FAILED"


# -- the runner, for real ------------------------------------------------------------------------
JOB = """#!/bin/bash
#SBATCH --time={time}
#SBATCH --signal=B:USR1@{warning}
trap 'echo warned; exit 7' USR1
trap 'echo terminated; exit 0' TERM
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST with $SLURM_CPUS_ON_NODE cpus, $JSR_LOCAL_MODE"
{body}
"""


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalJobs:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the runner's state dir is in $HOME
    return LocalJobs(LocalTransport())


def job_dir(tmp_path: Path, body: str, time: str = "10", warning: int = 60) -> str:
    directory = tmp_path / "job"
    directory.mkdir()
    (directory / "job.sbatch").write_text(JOB.format(time=time, warning=warning, body=body))
    return str(directory)


async def ended(jobs: LocalJobs, job_id: str, within: float = 20.0) -> str:
    for _ in range(int(within / 0.1)):
        info = (await jobs.query([job_id]))[job_id]
        if info.is_final:
            return f"{info.state} {info.exit_code}"
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job_id} did not end within {within} s")


async def test_a_job_runs_with_the_slurm_variables_of_one_node_and_its_exit_is_kept(
    jobs: LocalJobs, tmp_path: Path
) -> None:
    directory = job_dir(tmp_path, "exit 3")
    job_id = await jobs.submit(f"{directory}/job.sbatch")
    assert is_local_job_id(job_id)
    assert await ended(jobs, job_id) == "FAILED 3"
    out = Path(directory, f"slurm-{job_id}.out").read_text()
    assert f"job {job_id} on " in out and f"with {os.cpu_count()} cpus, 1" in out


async def test_an_earlier_jobs_exit_status_left_under_the_same_pid_is_not_this_jobs(
    jobs: LocalJobs, tmp_path: Path
) -> None:
    directory = job_dir(tmp_path, "sleep 60 & wait")
    job_id = await jobs.submit(f"{directory}/job.sbatch")
    state_dir = tmp_path / "home" / ".jupyter-slurm-ray" / "local-jobs"
    (state_dir / f"{job_id}.exit").write_text("CANCELLED 0 1700000000\n")
    assert (await jobs.query([job_id]))[job_id].state == "RUNNING"
    await jobs.cancel(job_id)
    assert await ended(jobs, job_id) == "CANCELLED 0"


async def test_cancel_is_scancels_sigterm_and_leaves_nothing(
    jobs: LocalJobs, tmp_path: Path
) -> None:
    directory = job_dir(tmp_path, "sleep 60 & wait")
    job_id = await jobs.submit(f"{directory}/job.sbatch")
    assert (await jobs.query([job_id]))[job_id].state == "RUNNING"
    out = Path(directory, f"slurm-{job_id}.out")
    while "job " not in (out.read_text() if out.exists() else ""):  # its TERM trap is set
        await asyncio.sleep(0.05)
    await jobs.cancel(job_id)
    assert await ended(jobs, job_id) == "CANCELLED 0"
    assert "terminated" in Path(directory, f"slurm-{job_id}.out").read_text()
    pid = int(job_id.removeprefix("local-"))
    with pytest.raises(ProcessLookupError):  # the runner's whole process group is gone
        for _ in range(50):
            os.killpg(pid, 0)
            await asyncio.sleep(0.1)


async def test_the_walltime_warns_with_usr1_like_slurms_signal_option(
    jobs: LocalJobs, tmp_path: Path
) -> None:
    directory = job_dir(tmp_path, "sleep 60 & wait", time="1", warning=59)
    job_id = await jobs.submit(f"{directory}/job.sbatch")
    assert await ended(jobs, job_id) == "FAILED 7"  # the job's USR1 trap ended it
    assert "warned" in Path(directory, f"slurm-{job_id}.out").read_text()


async def test_what_only_slurm_has_is_refused_in_its_words(jobs: LocalJobs) -> None:
    with pytest.raises(ExtendRefused, match="local mode"):
        await jobs.extend("local-1", 30)
    assert await jobs.partitions() == [] and await jobs.tagged_jobs() == {}


def test_a_local_cluster_is_not_scaled_since_worker_jobs_need_slurm() -> None:
    cluster = SlurmRayCluster(ClusterSpec(mode="local", time="10"), LocalTransport())
    assert cluster.target == "local mode" and isinstance(cluster.slurm, LocalJobs)
    with pytest.raises(SpecError) as error:
        cluster.scale(2)
    assert error.value.field == "nodes" and "local mode" in str(error.value)


async def test_the_usage_of_a_local_cluster_says_there_is_no_accounting() -> None:
    usage = await fetch_usage(LocalTransport(), ["local-42"])
    assert usage.unavailable == "local mode has no Slurm accounting"


async def test_a_machine_without_sbatch_is_silence_that_suggests_local_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sh").symlink_to("/bin/sh")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a shell, no sbatch: exit status 127
    slurm = SlurmClient(LocalTransport())
    with pytest.raises(SlurmUnavailable) as error:
        await slurm.submit("#!/bin/bash\ntrue\n")
    assert "sbatch is not installed here" in str(error.value)


def test_the_panel_in_local_mode_asks_slurm_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_SLURM_RAY_COMMAND_PREFIX", "/nonexistent/slurm-wrapper")
    monkeypatch.setenv("JUPYTER_SLURM_RAY_MODE", "local")
    panel = ClusterPanel(session=Session(SlurmRay()))
    try:
        assert panel.partitions == [] and "local mode" in panel.message.value
        panel.walltime.value = "10"
        assert panel.spec().mode == "local"
    finally:
        panel.close()


def test_the_panel_asks_slurm_nothing_when_the_default_profile_is_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.laptop]\nmode = "local"\ndescription = "Ray here"\n')
    monkeypatch.setenv("JUPYTER_SLURM_RAY_COMMAND_PREFIX", "/nonexistent/slurm-wrapper")
    monkeypatch.setenv("JUPYTER_SLURM_RAY_PROFILES_FILE", str(profiles))
    monkeypatch.setenv("JUPYTER_SLURM_RAY_DEFAULT_PROFILE", "laptop")
    panel = ClusterPanel(session=Session(SlurmRay()))
    try:
        assert panel.partitions == [] and "local mode" in panel.message.value
        assert panel.profile.value == "laptop"
        panel.walltime.value = "10"
        assert panel.spec().mode == "local"
    finally:
        panel.close()


async def test_the_job_gets_only_the_variables_its_export_line_names(
    jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOO_SETTING", "on")
    monkeypatch.setenv("DATABASE_URL", "postgres://app:pw@db/app")
    directory = job_dir(tmp_path, 'echo "[$FOO_SETTING|$DATABASE_URL|$HOME|${PATH:+path}]"')
    script = Path(directory, "job.sbatch")
    script.write_text(script.read_text().replace("\n", "\n#SBATCH --export=FOO_SETTING\n", 1))
    job_id = await jobs.submit(str(script))
    assert await ended(jobs, job_id) == "COMPLETED 0"
    home = pwd.getpwuid(os.getuid()).pw_dir  # as slurmstepd sets it, not the kernel's $HOME
    out = Path(directory, f"slurm-{job_id}.out").read_text()
    assert f"[on||{home}|path]" in out
