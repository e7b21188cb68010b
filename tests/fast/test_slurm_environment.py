"""Nested submission: no Slurm variable of an enclosing job reaches the Slurm commands the
package runs (kernel side, over SSH, inside the cluster's own job), checked against the lists
in Slurm's man pages: each release's extract (tests/resources/slurm-output/<version>/, written
by scripts/capture-slurm-output from that release's man pages), and the installed ones."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_slurm_ray.bootstrap import slurmenv
from jupyter_slurm_ray.transport import (
    LocalTransport,
    remote_command,
)

from ..helpers.bootstrap import bootstrap_module
from ..helpers.paths import REPO

EXTRACTS = sorted(
    (REPO / "tests" / "resources" / "slurm-output").glob("*/environment-variables.json")
)
MAN_DIR = Path("/usr/share/man/man1")
COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "sacct", "scancel", "sinfo")
INPUT_SECTIONS = {"INPUT ENVIRONMENT VARIABLES", "ENVIRONMENT VARIABLES"}

# What a notebook server's job has (sbatch -N1 -c1 --mem=1G, then srun for the server, as
# batchspawner does): Slurm's own output variables, the step's binding, and what users set.
OUTER_JOB = {
    "SLURM_JOB_ID": "41",
    "SLURM_JOBID": "41",
    "SLURM_MEM_PER_NODE": "1024",
    "SLURM_CPUS_PER_TASK": "1",
    "SLURM_CPUS_ON_NODE": "1",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "1",
    "SLURM_JOB_NODELIST": "node1",
    "SLURM_STEP_ID": "0",
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
    "SLURM_CPU_BIND_TYPE": "mask_cpu:",
    "SLURM_DISTRIBUTION": "cyclic",
    "SLURM_EXPORT_ENV": "PATH,HOME",
    "SRUN_CPUS_PER_TASK": "1",
    "SBATCH_PARTITION": "jupyter",
    "SQUEUE_FORMAT": "%i",
    "SLURM_TIME_FORMAT": "relative",
    "SCANCEL_INTERACTIVE": "1",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
}


def man_page_variables(text: str, sections: set[str]) -> list[str]:
    """The variable names of a man page's sections (the bold word after each ``.TP``)."""
    names: list[str] = []
    inside = take = False
    for line in text.splitlines():
        if line.startswith(".SH"):
            inside, take = line[3:].strip().strip('"') in sections, False
        elif inside and line.startswith(".TP"):
            take = True
        elif take:
            names += re.findall(r"\\fB([A-Z][A-Z0-9_]*)\\fR", line)
            take = False
    return names


def _installed(command: str, sections: set[str]) -> list[str] | None:
    page = MAN_DIR / f"{command}.1.gz"
    if not page.exists():
        return None
    return man_page_variables(gzip.open(page, "rt", errors="replace").read(), sections)


def _sources() -> list[tuple[str, dict[str, list[str]], list[str]]]:
    """(name, input variables per command, sbatch's output variables): each release's
    committed extract, and the installed man pages when this machine has them."""
    found = []
    for path in EXTRACTS:
        extract = json.loads(path.read_text())
        found.append(
            ("extract " + extract["slurm_version"], extract["input"], extract["sbatch_output"])
        )
    installed = {c: _installed(c, INPUT_SECTIONS) for c in (*COMMANDS, "sacctmgr")}
    output = _installed("sbatch", {"OUTPUT ENVIRONMENT VARIABLES"})
    if output is not None and all(names is not None for names in installed.values()):
        found.append(("installed man pages", installed, output))  # type: ignore[arg-type]
    return found


SOURCES = _sources()


@pytest.fixture(params=SOURCES, ids=[source[0] for source in SOURCES])
def man_pages(request) -> tuple[dict[str, list[str]], list[str]]:
    return request.param[1], request.param[2]


#: What Slurm sets for a batch job in any release: it stays inside the cluster's own job,
#: whichever release runs it (SLURM_GPUS_PER_TASK is 22.05's, SLURM_NETWORK 26.05's).
EVERY_JOBS_OWN = frozenset(name for source in SOURCES for name in source[2])


def test_each_extract_names_its_source_and_every_command():
    versions = []
    for path in EXTRACTS:
        extract = json.loads(path.read_text())
        assert extract["slurm_version"] == path.parent.name and "man" in extract["source"]
        assert set(extract["input"]) == {*COMMANDS, "sacctmgr"}
        assert len(extract["input"]["srun"]) > 90
        assert "SLURM_MEM_PER_NODE" in extract["sbatch_output"]
        versions.append(extract["slurm_version"].rsplit(".", 1)[0])
    assert {"22.05", "24.11", "26.05"} <= set(versions)


def test_the_man_pages_are_read_as_lists_of_names(man_pages):
    inputs, output = man_pages
    assert "SLURM_MEM_PER_NODE" in inputs["srun"] and "SLURM_JOB_ID" in output
    # srun's CPUs per task: SRUN_CPUS_PER_TASK in 22.05, SLURM_CPUS_PER_TASK from 23.11 on
    assert {"SRUN_CPUS_PER_TASK", "SLURM_CPUS_PER_TASK"} & set(inputs["srun"])
    assert "SQUEUE_FORMAT" in inputs["squeue"] and "SCANCEL_INTERACTIVE" in inputs["scancel"]
    assert "SBATCH_CLUSTERS" in inputs["sbatch"] and "SLURM_CLUSTERS" in inputs["sbatch"]


def test_every_input_variable_of_every_command_is_removed_outside_a_job(man_pages):
    inputs, _ = man_pages
    for command, names in inputs.items():
        for name in names:
            kept = name in slurmenv.KEPT
            assert slurmenv.is_slurm_input(name, in_own_job=False) is not kept, (command, name)
    assert {"SLURM_CONF"} == slurmenv.KEPT  # which Slurm, not what to ask for


def test_inside_the_job_only_the_jobs_own_input_variables_stay(man_pages):
    inputs, job_own = man_pages
    for command, names in inputs.items():
        for name in names:
            removed = slurmenv.is_slurm_input(name, in_own_job=True)
            own = name in EVERY_JOBS_OWN or name in slurmenv.KEPT
            # an input Slurm sets for a batch job stays (srun --overlap needs SLURM_JOB_ID…),
            # every other one came from outside the job and goes
            assert removed is not (own and name.startswith("SLURM_")), (command, name)
    assert not slurmenv.FOREIGN_IN_A_JOB & set(job_own)


def test_the_foreign_list_is_exactly_the_man_pages_not_more():
    slurm_inputs = {
        name
        for _, inputs, _ in SOURCES
        for names in inputs.values()
        for name in names
        if name.startswith("SLURM_")
    }
    assert slurm_inputs - EVERY_JOBS_OWN - slurmenv.KEPT == slurmenv.FOREIGN_IN_A_JOB


def _outer_job_everywhere(monkeypatch, man_pages) -> None:
    inputs, _ = man_pages
    for names in inputs.values():
        for name in names:
            monkeypatch.setenv(name, "from-the-outer-job")
    for name, value in OUTER_JOB.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("JSR_NOT_SLURMS", "kept")


def _names(env0: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in env0.split("\0") if item)
    return {name: value for name, _, value in pairs}


def _outside_a_job_is_clean(seen: dict[str, str]) -> None:
    slurm = {n for n in seen if slurmenv.is_slurm_variable(n)}
    assert slurm == {"SLURM_CONF"}, sorted(slurm)
    assert seen["SLURM_CONF"] == "/etc/slurm/slurm.conf" and seen["JSR_NOT_SLURMS"] == "kept"


async def test_commands_run_here_get_no_variable_of_the_outer_job(monkeypatch, man_pages):
    _outer_job_everywhere(monkeypatch, man_pages)
    transport = LocalTransport()
    _outside_a_job_is_clean(_names((await transport.run(["env", "-0"])).stdout))
    prefixed = LocalTransport(["env"])  # a command_prefix (runuser, a site wrapper) too
    _outside_a_job_is_clean(_names((await prefixed.run(["env", "-0"])).stdout))


async def test_files_sent_here_are_written_without_them_too(monkeypatch, man_pages, tmp_path):
    _outer_job_everywhere(monkeypatch, man_pages)
    source = tmp_path / "data"
    source.write_text("x")
    spy = tmp_path / "bin"
    spy.mkdir()
    (spy / "sh").write_text(f'#!/bin/sh\nenv -0 >{tmp_path}/env\nexec /bin/sh "$@"\n')
    (spy / "sh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{spy}:{os.environ['PATH']}")
    await LocalTransport().send_file(str(source), str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_text() == "x"
    _outside_a_job_is_clean(_names((tmp_path / "env").read_text()))


def test_over_ssh_the_login_shell_of_an_allocation_passes_none_on(man_pages):
    inputs, _ = man_pages
    login_shell = {**os.environ, "JSR_NOT_SLURMS": "kept", **OUTER_JOB}
    login_shell.update({name: "x" for names in inputs.values() for name in names} | OUTER_JOB)
    line = remote_command(["env", "-0"])  # what the SSH server's shell is given
    done = subprocess.run(["sh", "-c", line], env=login_shell, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    _outside_a_job_is_clean(_names(done.stdout))


def test_over_ssh_arguments_and_stdin_still_arrive_unchanged():
    argument = 'it\'s $HOME; `x` "y" \\ *'
    line = remote_command(["sh", "-c", 'printf "%s|" "$1"; cat', "sh", argument])
    done = subprocess.run(["sh", "-c", line], input="stdin", capture_output=True, text=True)
    assert done.stdout == argument + "|stdin"


# -- inside the cluster's own job ---------------------------------------------------------------
OWN_JOB = {  # what Slurm set for the cluster's job, and what came from outside
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_JOB_CPUS_PER_NODE": "1(x3)",
    "SLURM_MEM_PER_CPU": "1024",
    "SLURM_EXPORT_ENV": "PATH,HOME",
    "SLURMD_NODENAME": "node1",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
}
FROM_OUTSIDE = {
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
    "SRUN_CPUS_PER_TASK": "1",
    "SRUN_EXPORT_ENV": "NONE",
    "SLURM_TIME_FORMAT": "relative",
    "SCANCEL_INTERACTIVE": "1",
    "SBATCH_PARTITION": "jupyter",
}


def _fake_command(directory: Path, name: str, output: str = "") -> Path:
    """An executable ``name`` that saves its environment to ``<name>.env`` and prints output."""
    path = directory / name
    path.write_text(f"#!/bin/sh\nenv -0 >{directory / name}.env\nprintf '%s' '{output}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def own_job(monkeypatch, tmp_path) -> Path:
    for name, value in {**OWN_JOB, **FROM_OUTSIDE}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return tmp_path


def _inside_the_job_is_clean(seen: dict[str, str]) -> None:
    assert {name: seen.get(name) for name in OWN_JOB} == OWN_JOB
    assert not set(FROM_OUTSIDE) & set(seen)


def test_the_worker_step_gets_the_jobs_own_variables_only(own_job):
    workerstep = bootstrap_module("workerstep")
    srun = _fake_command(own_job, "srun")
    step = workerstep.WorkerStep(own_job)
    step.start(str(srun), own_job, 2)
    deadline = time.monotonic() + 10
    while step.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert step.exit_code() == 0
    _inside_the_job_is_clean(_names((own_job / "srun.env").read_text()))
    argv = workerstep.worker_step_argv("srun", own_job, 2, slurmenv.own_job_environment())
    assert "--exclude=node1" in argv and "--cpus-per-task=1" in argv and "--export=ALL" in argv


def test_the_bootstraps_scontrol_and_scancel_get_the_jobs_own_variables_only(own_job):
    nodeaddr = bootstrap_module("nodeaddr")
    _fake_command(own_job, "scontrol", "SlurmctldHost[0] = ctl(10.9.8.7)\n")
    assert nodeaddr.slurmctld_address() == "10.9.8.7"
    _inside_the_job_is_clean(_names((own_job / "scontrol.env").read_text()))

    headrun = bootstrap_module("headrun")
    _fake_command(own_job, "scancel")
    head = headrun.HeadRun.__new__(headrun.HeadRun)  # only its worker job list is used
    head.worker_jobs = {"78"}
    head.cancel_worker_jobs()
    _inside_the_job_is_clean(_names((own_job / "scancel.env").read_text()))
