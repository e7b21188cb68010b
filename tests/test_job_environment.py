"""The job's environment is an allow-list, on the real testbed: a kernel whose environment
holds credentials of every kind starts a cluster of a 2-node head allocation and a worker job;
none of them is in any Ray process on any node (the head's, the worker step's, the worker
job's), the variable named in ``export_env`` is in all of them, and ``script()`` lists exactly
what goes (read as root from ``/proc/<pid>/environ``).
"""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.spec.environment import DEFAULT_EXPORT
from jupyter_slurm_ray.states import State
from jupyter_slurm_ray.transport import LocalTransport

from .helpers.clusters import (
    ProcessEnvironment,
    cluster_spec,
    processes_of,
    wait_until_nothing_left,
)
from .helpers.jobs import in_queue
from .helpers.testbed import runuser
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

SECRETS = {
    "DATABASE_URL": "postgres://app:db-pw-4711@db.example/app",
    "GH_PAT": "ghp_pat4711secret",
    "HTTPS_PROXY": "http://user:proxy-pw-4711@proxy.example:3128",
    "KUBECONFIG": "/home/alice/.kube/config-4711",
    "NETRC": "/home/alice/.netrc-4711",
    "KRB5CCNAME": "FILE:/tmp/krb5cc_4711",
    "JUPYTERHUB_API_TOKEN": "hub-token-4711",
}
ALLOWED = {"FOO_SETTING": "foo-4711"}
# Variables a job's processes may have with the same value as the kernel's without it being
# passed on: slurmstepd sets the user's SHELL (with HOME, USER, LOGNAME, MAIL, TMPDIR) from
# the password database, whatever the submitter's is; bash counts its SHLVL; Ray and the
# bootstrap set Ray's own RAY_* (RAY_CLIENT_MODE, RAY_USAGE_STATS_ENABLED, ...).
# COLUMNS and LINES: a terminal's size, not the kernel's to leak. On trixie (Python 3.13, Slurm
# 24.11) Ray Client's server had them at the kernel's values while the batch step had neither
SET_BY_THE_JOB_ITSELF = {"SHELL", "SHLVL", "COLUMNS", "LINES"}
SET_BY_RAY = "RAY_"


def _described(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        command = "(ended)"
    return f"pid {pid}: {command[:300]}"


def _kernel_as_the_probe_sees_it(user: str) -> dict[str, str]:
    """This process's environment as the cluster's commands get it (through runuser)."""
    done = subprocess.run([*runuser(user), "env", "-0"], capture_output=True, text=True)
    return dict(item.partition("=")[::2] for item in done.stdout.split("\0") if "=" in item)


def _exported(script: str) -> list[str]:
    (line,) = [line for line in script.splitlines() if line.startswith("#SBATCH --export=")]
    return line.removeprefix("#SBATCH --export=").split(",")


def test_only_the_allow_list_reaches_any_ray_process_on_any_node(testbed, tmp_path, monkeypatch):
    for name, value in {**SECRETS, **ALLOWED}.items():
        monkeypatch.setenv(name, value)
    spec = cluster_spec(nodes=2, export_env=["FOO_SETTING"], owner_timeout=30)
    cluster = SlurmRayCluster(
        spec, LocalTransport(runuser(testbed.user)), registry=Registry(tmp_path / "state")
    )
    kernel = _kernel_as_the_probe_sees_it(testbed.user)
    shown = cluster.script()
    worker_jobs: list[str] = []
    try:
        cluster.up(connect=False)
        assert cluster.state is State.READY
        cluster.scale(3)  # one worker job: its own script and allocation
        worker_jobs = [job.job_id for job in cluster.workers.active()]
        wait_for(lambda: cluster.refresh().nodes_joined == 3, 180, "3 nodes joined")
        scripts = [Path(cluster.job_dir, "job.sbatch").read_text()]
        scripts += [p.read_text() for p in Path(cluster.job_dir).glob("worker*.sbatch")]
        assert len(scripts) == 2

        # script() lists exactly what goes: the names of the kernel's environment that are
        # on the documented list or named in export_env, no others
        patterns = [*DEFAULT_EXPORT, "FOO_SETTING"]
        expected = sorted(n for n in kernel if any(fnmatch.fnmatchcase(n, p) for p in patterns))
        assert _exported(shown) == expected
        for script in scripts:
            assert _exported(script) == expected
        assert "FOO_SETTING" in expected and not set(SECRETS) & set(expected)

        jobs: dict[str | None, str] = {}
        whole_blocks = 0
        for pid in processes_of(cluster.job_dir):
            seen = ProcessEnvironment.of(pid)
            if seen is None:
                continue
            data, environ, whole = seen.block, seen.variables, seen.whole
            # no secret by name, nor its value anywhere in the block (under any name)
            assert not set(SECRETS) & set(environ), _described(pid)
            assert not [v for v in SECRETS.values() if v.encode() in data], _described(pid)
            if not whole:
                continue
            whole_blocks += 1
            jobs[environ.get("SLURM_JOB_ID")] = _described(pid)
            assert {name: environ.get(name) for name in ALLOWED} == ALLOWED, _described(pid)
            # and nothing else of the kernel's that was not listed
            others = {n for n, v in kernel.items() if n not in expected and environ.get(n) == v}
            others = {n for n in others if not n.startswith(SET_BY_RAY)}
            assert others <= SET_BY_THE_JOB_ITSELF, (_described(pid), others)
        assert whole_blocks > 10
        assert set(jobs) == {cluster.job_id, *worker_jobs}, jobs  # the head's and the worker job's
    finally:
        cluster.down()
    wait_until_nothing_left(cluster.job_id, cluster.job_dir)
    for job_id in worker_jobs:
        wait_for(lambda job_id=job_id: not in_queue(job_id), 60, f"worker job {job_id} to end")
