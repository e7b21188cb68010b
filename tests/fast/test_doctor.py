"""``doctor`` on a scripted Slurm, and the cluster's Python when ``python`` is not set.

The fake's ``srun`` runs the step for real on this machine (the steps' shell program, the
cluster's Python, the listener): this machine plays the compute node. Each broken setting
gives exactly its one ✗, with a fix; the test job is always cancelled and its files removed.
(The same on the real testbed: tests/test_doctor.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from jupyter_slurm_ray.client.connect import local_versions
from jupyter_slurm_ray.doctor.checklist import Report, _check_submit, _pack_check, run_doctor
from jupyter_slurm_ray.doctor.libraries import libraries_verdict
from jupyter_slurm_ray.doctor.testjob import NodeReport
from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.job.directory import (
    JobDir,
    KernelEnvironment,
    filesystem_type,
    kernel_environment,
)
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.transport import DEFAULT_TIMEOUT, CommandResult, SSHTransport
from jupyter_slurm_ray.ui.cli import main

from ..helpers.fakeslurm import FakeSlurm, FakeTransport
from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import MagicShell


def _global_interface() -> str | None:
    listing = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True
    ).stdout
    match = re.search(r"^\d+:\s+(\S+)\s+inet ", listing, re.M)
    return match.group(1) if match else None


INTERFACE = _global_interface()
needs_an_interface = pytest.mark.skipif(INTERFACE is None, reason="no global IPv4 address here")


class NodeHere(FakeTransport):
    """The fake Slurm, whose jobs start at once and whose ``srun`` runs the step here.

    ``node_root``: the node sees the job dir root elsewhere (a filesystem not shared)."""

    def __init__(self, slurm: FakeSlurm, *, start: bool = True) -> None:
        super().__init__(slurm)
        self.start = start
        self.node_root: tuple[str, str] | None = None

    async def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> CommandResult:
        if argv and argv[0] == "srun":
            self.commands.append(tuple(argv))
            step = list(argv[argv.index("bash") :])
            if self.node_root is not None and step[4]:
                step[4] = step[4].replace(*self.node_root)
            return await super().run(step, input=input, timeout=timeout, check=check)
        result = await super().run(argv, input=input, timeout=timeout, check=check)
        if self.start and "sbatch" in argv and "--version" not in argv:
            self.slurm.run(result.stdout.strip(), nodes="node1")
        return result


@pytest.fixture
def transport(slurm: FakeSlurm) -> NodeHere:
    return NodeHere(slurm)


def spec(jobs_root: Path, **settings) -> ClusterSpec:
    base = dict(time="10", job_dir_root=str(jobs_root), network_interface=INTERFACE)
    return ClusterSpec(**{**base, **settings})


def fake_python(directory: Path, ray_module: str) -> str:
    """An executable 'python' in ``directory``: this Python, with a fake ``ray`` first."""
    (directory / "fake" / "ray").mkdir(parents=True)
    (directory / "fake" / "ray" / "__init__.py").write_text(ray_module)
    python = directory / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={directory / "fake"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


@pytest.fixture
def quick_python(tmp_path: Path) -> str:
    """A cluster Python whose ``ray`` is a stand-in of this kernel's version (imports fast)."""
    return fake_python(tmp_path / "quick", f"__version__ = {local_versions()[0]!r}\n")


def failed(report: Report) -> list[str]:
    return report.failed()


# -- a healthy site ---------------------------------------------------------------------------
@needs_an_interface
async def test_a_healthy_site_passes_every_check_and_the_test_job_is_cancelled(
    transport, slurm, jobs_root
):
    report = await run_doctor(spec(jobs_root), transport)
    assert failed(report) == [], report.text()
    statuses = {check.name: check.status for check in report.checks}
    assert statuses["ssh"] == "skip"  # local: not used
    assert {statuses[n] for n in ("slurm", "request", "job_dir", "python", "address")} == {"ok"}
    assert statuses["ray"] in ("ok", "warn")  # warn only when import ray is slow here
    job = slurm.only_job()
    assert job.state == "CANCELLED"
    assert report.test_job["job_id"] == job.job_id and report.test_job["node"] == "node1"
    assert report.test_job["queue_wait"] is not None
    assert list(jobs_root.iterdir()) == []  # the probe dir is gone
    assert f"Ray {local_versions()[0]}" in report.check("ray").detail


@needs_an_interface
async def test_the_report_is_a_table_text_and_json(transport, jobs_root):
    report = await run_doctor(spec(jobs_root), transport)
    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"].splitlines()[0].endswith("all checks passed")
    assert "<table" in bundle["text/html"] and "✓" in bundle["text/html"]
    data = json.loads(report.to_json())
    assert data["ok"] is True
    assert [c["name"] for c in data["checks"]] == [
        "ssh", "slurm", "submit", "request", "job_dir", "test_job", "python", "ray", "libraries",
        "address", "driver", "protections", "extensions",
    ]  # fmt: skip
    protections = report.check("protections").detail
    assert protections.startswith("TLS: Ray's channels with the cluster's own CA")
    assert "every port the kernel's choice" in protections and "Ray's metrics off" in protections


def test_the_protections_line_says_what_is_off_and_what_is_missing_on_the_node():
    from jupyter_slurm_ray.doctor.checklist import protections_check
    from jupyter_slurm_ray.doctor.testjob import NodeReport

    found = NodeReport(python={"openssl": "OpenSSL 3.0.19"})
    plain = protections_check(ClusterSpec(tls=False, port_strategy="random"), found)
    assert plain.status == "warn" and plain.detail.startswith("TLS off")
    assert "predictable" in plain.detail and "receives the token" in plain.fix
    missing = protections_check(ClusterSpec(), NodeReport(python={"openssl": None}))
    assert missing.status == "fail" and "openssl" in missing.fix
    metrics = protections_check(ClusterSpec(ray_metrics=True), found)
    assert metrics.status == "warn" and "(OpenSSL 3.0.19 on the node)" in metrics.detail


@needs_an_interface
async def test_from_a_slurm_job_doctor_checks_that_the_node_reaches_this_kernel(
    transport, jobs_root, monkeypatch
):
    """Where connect = "auto" would choose driver mode (a kernel in a job, or outside jobs on
    a host driver_hosts allows: any, unset), the test job's node connects back to a listener
    of this process on a port of port_range (one more srun step)."""
    kept_off = await run_doctor(spec(jobs_root), transport, driver_hosts=[])
    assert kept_off.check("driver").status == "skip"
    assert "which driver_hosts does not allow" in kept_off.check("driver").detail
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    report = await run_doctor(spec(jobs_root), transport, driver_hosts=[])
    driver = report.check("driver")
    assert driver.status == "ok" and "node1 reached this kernel at" in driver.detail, driver
    reach = [argv for argv in transport.commands if argv[0] == "srun" and "jsr-reach" in argv]
    assert len(reach) == 1 and reach[0][2] == "--overlap" and reach[0][-1].isdigit()
    low, high = ClusterSpec().port_range
    assert low <= int(reach[0][-1]) <= high
    monkeypatch.delenv("SLURM_JOB_ID")
    login = await run_doctor(spec(jobs_root), transport)  # driver_hosts unset: any host
    assert login.check("driver").status == "ok", login.check("driver")


# -- each broken setting: exactly its one ✗, with the fix --------------------------------------
@needs_an_interface
async def test_a_python_without_ray_fails_only_the_ray_check(transport, jobs_root, tmp_path):
    python = fake_python(tmp_path, "raise ModuleNotFoundError(\"No module named 'ray'\")\n")
    report = await run_doctor(spec(jobs_root, python=python), transport)
    assert failed(report) == ["ray"], report.text()
    ray = report.check("ray")
    assert "No module named 'ray'" in ray.detail
    assert f"ray[default]=={local_versions()[0]}" in ray.fix


@needs_an_interface
async def test_another_ray_version_fails_only_the_ray_check(transport, jobs_root, tmp_path):
    python = fake_python(tmp_path, '__version__ = "2.0.0"\n')
    report = await run_doctor(spec(jobs_root, python=python), transport)
    assert failed(report) == ["ray"], report.text()
    assert "the node has Ray 2.0.0" in report.check("ray").detail
    assert "same Ray version" in report.check("ray").fix


@needs_an_interface
async def test_a_python_that_is_missing_fails_only_the_python_check(transport, jobs_root):
    report = await run_doctor(spec(jobs_root, python="/no/such/python3"), transport)
    assert failed(report) == ["python"], report.text()
    assert "/no/such/python3" in report.check("python").detail
    assert "set python" in report.check("python").fix


@needs_an_interface
async def test_a_failing_setup_line_is_named(transport, jobs_root):
    report = await run_doctor(spec(jobs_root, setup=["true", "false"]), transport)
    assert failed(report) == ["python"], report.text()
    assert "setup line 2 failed" in report.check("python").detail


async def test_a_bad_network_interface_fails_only_the_address_check(
    transport, jobs_root, quick_python
):
    asked = spec(jobs_root, network_interface="nosuch0", python=quick_python)
    report = await run_doctor(asked, transport)
    assert failed(report) == ["address"], report.text()
    address = report.check("address")
    assert "network_interface nosuch0 has no IPv4 address" in address.detail
    assert address.fix.startswith("set network_interface to an interface of the nodes")


@needs_an_interface
async def test_a_job_dir_root_the_node_does_not_share_fails_only_that_check(
    transport, jobs_root, tmp_path, quick_python
):
    elsewhere = tmp_path / "node-side"
    elsewhere.mkdir()
    transport.node_root = (str(jobs_root), str(elsewhere))
    report = await run_doctor(spec(jobs_root, python=quick_python), transport)
    assert failed(report) == ["job_dir"], report.text()
    check = report.check("job_dir")
    assert "is not shared" in check.detail and "did not see the file written here" in check.detail
    assert "set job_dir_root" in check.fix


@needs_an_interface
async def test_a_walltime_over_the_partition_limit_fails_only_the_request_check(
    transport, slurm, jobs_root, quick_python
):
    asked = spec(jobs_root, time="2:00:00", partition="short", python=quick_python)
    report = await run_doctor(asked, transport)
    assert failed(report) == ["request"], report.text()
    request = report.check("request")
    assert "at most 00:30:00 in partition short (MaxTime=00:30:00)" in request.detail
    assert "time (-t)" in request.fix
    assert slurm.only_job().state == "CANCELLED"  # the test job itself ran (5 minutes)


async def test_an_untrusted_job_dir_root_is_a_failure_naming_the_setting(transport, tmp_path):
    root = tmp_path / "open"
    root.mkdir()
    root.chmod(0o777)
    report = await run_doctor(spec(root / "jobs"), transport)
    assert "job_dir" in failed(report)
    assert "writable by other users" in report.check("job_dir").detail


# -- Slurm and the queue ------------------------------------------------------------------------
async def test_a_silent_slurm_fails_that_check_and_submits_nothing(transport, slurm, jobs_root):
    slurm.down = True
    report = await run_doctor(spec(jobs_root), transport)
    assert failed(report) == ["slurm"], report.text()
    assert "sinfo" in report.check("slurm").fix
    assert slurm.jobs == {}
    assert report.check("test_job").status == "skip"


async def test_a_test_job_that_never_starts_is_cancelled_and_says_why(slurm: FakeSlurm, jobs_root):
    transport = NodeHere(slurm, start=False)
    report = await run_doctor(spec(jobs_root), transport, queue_timeout=1.0)
    assert "test_job" in failed(report)
    assert "Slurm's reason: Priority" in report.check("test_job").detail
    assert "--queue-timeout" in report.check("test_job").fix
    assert slurm.only_job().state == "CANCELLED"


async def test_a_refused_test_job_fails_with_slurms_words(transport, slurm, jobs_root):
    slurm.refuse_submit = "Invalid account or account/partition combination specified"
    report = await run_doctor(spec(jobs_root), transport)
    assert "test_job" in failed(report)
    assert "Invalid account" in report.check("test_job").detail


# -- the commands ----------------------------------------------------------------------------
@pytest.mark.usefixtures("root_logging_kept")
def test_the_cli_prints_json_and_exits_1_when_a_check_fails(
    site, capsys, quick_python, monkeypatch
):
    monkeypatch.setenv("JUPYTER_SLURM_RAY_PYTHON", quick_python)
    monkeypatch.setenv("JUPYTER_SLURM_RAY_NETWORK_INTERFACE", INTERFACE or "lo")
    status = main(["doctor", "--json", "-t", "2:00:00", "-p", "short", "--queue-timeout", "1"])
    data = json.loads(capsys.readouterr().out)
    assert status == 1 and data["ok"] is False
    assert "request" in [c["name"] for c in data["checks"] if c["status"] == "fail"]


@needs_an_interface
def test_the_magic_prints_the_checklist_and_cancels_the_test_job(
    magic: MagicShell, slurm, quick_python, monkeypatch
):
    monkeypatch.setenv("JUPYTER_SLURM_RAY_NETWORK_INTERFACE", INTERFACE or "lo")
    out, err, error = magic.run(f"%slurm_ray doctor -t 10 --python {quick_python}")
    assert error is None, err
    lines = out.splitlines()
    assert lines[0].startswith("doctor (") and lines[0].endswith(": all checks passed"), out
    titles = {line.partition(" ")[2].split("  ")[0]: line[0] for line in lines[1:]}
    assert titles["Slurm answers"] == "✓" and titles["A test job runs"] == "✓", out
    assert "✗" not in out
    assert slurm.only_job().state == "CANCELLED"


# -- the cluster's Python when `python` is not set (issue 10, item 1) ----------------------------
def test_the_kernels_environment_on_the_job_dir_roots_filesystem_is_taken(tmp_path):
    env = KernelEnvironment(str(tmp_path / "venv/bin/python"), str(tmp_path / "venv"), "/usr/bin/x")
    (tmp_path / "venv/bin").mkdir(parents=True)
    assert kernel_environment(str(tmp_path / "jobs"), env) is env


def test_a_kernel_environment_on_a_local_tmpfs_is_refused_naming_python_and_setup(tmp_path):
    shm = Path("/dev/shm")
    if filesystem_type(str(shm)) != "tmpfs" or filesystem_type(str(tmp_path)) == "tmpfs":
        pytest.skip("needs /dev/shm on tmpfs and the test's tmp dir elsewhere")
    env = KernelEnvironment("/dev/shm/venv/bin/python", "/dev/shm/venv", "/usr/bin/python3")
    with pytest.raises(SpecError) as refused:
        kernel_environment(str(tmp_path / "jobs"), env)
    assert refused.value.field == "python"
    message = str(refused.value)
    assert "is on tmpfs" in message and "set python" in message and "setup" in message


def test_filesystem_types_come_from_the_longest_mount_point():
    mountinfo = (
        "27 1 254:0 / / rw - ext4 /dev/vda rw\n"
        "60 27 0:50 / /home rw - nfs4 server:/home rw\n"
        "61 60 0:51 / /home/alice/fast rw - tmpfs tmpfs rw\n"
    )
    assert filesystem_type("/home/alice/env", mountinfo) == "nfs4"
    assert filesystem_type("/home/alice/fast/env", mountinfo) == "tmpfs"
    assert filesystem_type("/opt/env", mountinfo) == "ext4"


def test_unset_python_runs_the_kernels_python_with_its_bin_first_on_path(transport, jobs_root):
    command = JobDir(transport, f"{jobs_root}/c1").bootstrap_command(None)
    assert command[:3] == ["sh", "-c", 'PATH="$0:$PATH"; export PATH; exec "$@"']
    assert command[3:5] == [str(Path(sys.executable).parent), sys.executable]
    assert command[5:] == [f"{jobs_root}/c1/bootstrap", "head", f"{jobs_root}/c1"]
    path = subprocess.run(
        [*command[:5], "-c", "import os; print(os.environ['PATH'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert path.split(":")[0] == str(Path(sys.executable).parent)


def test_unset_python_over_ssh_is_python3_and_a_set_one_is_used_as_is():
    ssh = SSHTransport("login.example")
    assert JobDir(ssh, "/j/c1").bootstrap_command(None)[0] == "python3"
    assert JobDir(ssh, "/j/c1").bootstrap_command("/opt/py/bin/python")[0] == "/opt/py/bin/python"


async def test_the_rest_api_answers_the_checklist_as_json(
    jp_fetch, server_manager, slurm, quick_python, monkeypatch
):
    monkeypatch.setenv("JUPYTER_SLURM_RAY_PYTHON", quick_python)
    monkeypatch.setenv("JUPYTER_SLURM_RAY_NETWORK_INTERFACE", INTERFACE or "lo")
    monkeypatch.setenv("JUPYTER_SLURM_RAY_TIME", "2:00:00")
    monkeypatch.setenv("JUPYTER_SLURM_RAY_PARTITION", "short")
    response = await jp_fetch("slurm-ray", "api", "doctor", params={"queue_timeout": "5"})
    data = json.loads(response.body)
    assert response.code == 200 and data["ok"] is False
    failed_checks = [c["name"] for c in data["checks"] if c["status"] == "fail"]
    assert "request" in failed_checks
    extensions = next(c for c in data["checks"] if c["name"] == "extensions")
    assert "server extension" not in extensions["detail"]  # it answered: it runs


def test_a_packs_base_python_missing_on_the_node_is_a_failure_with_its_fix() -> None:
    missing = _pack_check(NodeReport(python={"pack_base_python": "/opt/py/bin/python3.11"}))
    assert missing.status == "fail"
    assert missing.detail == "the pack's base Python /opt/py/bin/python3.11 is not on the node"
    assert (
        "at /opt/py/bin/python3.11 on the compute nodes" in missing.fix and "conda" in missing.fix
    )
    conda = _pack_check(NodeReport(python={"python": "3.11.2"}))
    assert conda.status == "ok" and "from the pack" in conda.detail


# -- where jobs are submitted from: a kernel inside a Slurm job ----------------------------------
class NoSbatchHere(NodeHere):
    """A compute node whose site keeps sbatch on the login nodes (sinfo and squeue answer)."""

    async def run(self, argv, *, input=None, timeout=DEFAULT_TIMEOUT, check=True):
        if argv and argv[0] == "sbatch":
            self.commands.append(tuple(argv))
            return CommandResult(tuple(argv), 127, "", "sh: 1: sbatch: not found")
        return await super().run(argv, input=input, timeout=timeout, check=check)


async def test_no_sbatch_on_this_node_fails_the_submit_check_and_says_to_use_ssh_mode(
    slurm, jobs_root, monkeypatch
):
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # a kernel inside a notebook's job
    report = await run_doctor(spec(jobs_root), NoSbatchHere(slurm), queue_timeout=1)
    check = report.check("submit")
    assert check.status == "fail", report.text()
    assert check.detail == "no sbatch inside Slurm job 41 on this node: sh: 1: sbatch: not found"
    assert "login_host" in check.fix and "over SSH" in check.fix


async def test_a_kernel_inside_a_slurm_job_is_told_its_variables_stay_out(
    transport, jobs_root, monkeypatch
):
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    report = await run_doctor(spec(jobs_root), transport, queue_timeout=1)
    check = report.check("submit")
    assert check.status == "ok", report.text()
    assert check.detail == (
        "slurm 22.05.8 inside Slurm job 41 on this node "
        "(its SLURM_* variables are kept out of the cluster's request)"
    )


async def test_over_ssh_no_sbatch_on_the_login_node_names_login_host():
    class LoginWithoutSlurm(SSHTransport):
        async def run(self, argv, *, input=None, timeout=DEFAULT_TIMEOUT, check=True):
            return CommandResult(tuple(argv), 127, "", "bash: line 1: sbatch: command not found")

    checks: list = []
    await _check_submit(LoginWithoutSlurm("login.example"), checks.append)
    (check,) = checks
    assert check.status == "fail" and check.detail.startswith("no sbatch ssh://login.example:")
    assert check.fix == "set login_host to a login node that has Slurm's sbatch"


@pytest.mark.parametrize(
    ("node", "status", "words"),
    [
        ({"numpy": "2.1.0", "pandas": "2.2.3", "pyarrow": "18.0.0"}, "ok", "numpy 2.1.0, pandas"),
        ({"numpy": "2.1.0", "pandas": None, "pyarrow": None}, "warn", "lacks pandas, pyarrow"),
        ({"numpy": "1.26.4", "pandas": "2.2.3", "pyarrow": "18.0.0"}, "warn",
         "has numpy 1.26.4 (here 2.1.0)"),
    ],
)  # fmt: skip
def test_ray_datas_libraries_on_the_node_against_this_kernels(node, status, words):
    here = {"numpy": "2.1.0", "pandas": "2.2.3", "pyarrow": "18.0.0"}
    said, detail, fix = libraries_verdict(ClusterSpec(), {"libraries": node}, here)
    assert said == status and words in detail
    assert ("ray[default,data,train,tune]==" in fix) == (status == "warn")
    assert libraries_verdict(ClusterSpec(), {"libraries": node}, {})[0] == "skip"
    assert libraries_verdict(ClusterSpec(), None, here)[0] == "skip"  # its Python did not run
