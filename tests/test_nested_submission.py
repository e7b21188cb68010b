"""Nested submission on the real testbed: a kernel inside a Slurm job (batchspawner's and Open
OnDemand's shape: ``sbatch -N1 -c1 --mem=1G`` running the notebook) brings up a 2-node cluster.

The notebook job runs on node1 with what Slurm sets for it (memory per node, CPUs per task,
its job id…) and what a step with CPU binding adds (``SLURM_CPU_BIND*``,
``SRUN_CPUS_PER_TASK``). Passed on, those made the cluster's worker step fail at once (``srun:
fatal: SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from .helpers.bootstrap import run_as_user, write_as_user
from .helpers.clusters import ProcessEnvironment, processes_of, wait_until_nothing_left
from .helpers.jobs import in_queue
from .helpers.paths import REPO, VENV_ACTIVATE, VENV_PYTHON
from .helpers.testbed import USER
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

KERNEL = REPO / "tests" / "resources" / "kernel_in_a_job.py"
# What a notebook step bound to its CPU adds to what Slurm sets for the notebook job: bound to
# CPU 7, which no testbed node has, so that these values are told apart from the binding that
# Slurm gives the cluster's own steps where it binds them (task/affinity: `quiet,mask_cpu:0x1`
# on a 1-CPU step), which is the cluster's own and no leak.
BINDING = {
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x80",
    "SLURM_CPU_BIND_TYPE": "mask_cpu:",
    "SLURM_CPU_BIND_LIST": "0x80",
    "SLURM_CPU_BIND_VERBOSE": "quiet",
    "SRUN_CPUS_PER_TASK": "1",
}
NOTEBOOK_JOB = """#!/bin/bash
#SBATCH --job-name=jsr-nested-notebook
#SBATCH --nodes=1 --cpus-per-task=1 --mem=1G --nodelist=node1 --time=15
#SBATCH --output={work}/notebook.out --error={work}/notebook.out
export {binding}
exec {python} {kernel} {work} {python} {setup}
"""


def _events(work: Path) -> list[dict]:
    path = work / "report.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _event(work: Path, name: str, notebook_job: str) -> dict | None:
    """The kernel's ``name`` line; AssertionError at its ``error`` line or once its job ended."""
    events = _events(work)
    for event in events:
        if event["event"] == "error":
            raise AssertionError(f"the kernel in the notebook job failed:\n{event['error']}")
    found = next((event for event in events if event["event"] == name), None)
    if found is None and not in_queue(notebook_job):
        log = (work / "notebook.out").read_text() if (work / "notebook.out").exists() else ""
        raise AssertionError(f"the notebook job ended before {name!r}:\n{log[-3000:]}")
    return found


@pytest.mark.compat
def test_a_kernel_inside_a_slurm_job_brings_up_a_two_node_cluster(testbed):
    work = Path(f"/home/{USER}/.jsr-nested-{uuid.uuid4().hex[:8]}")
    run_as_user("mkdir", "-m", "700", str(work))
    binding = " ".join(f"{name}={shlex.quote(value)}" for name, value in BINDING.items())
    script = NOTEBOOK_JOB.format(
        work=work,
        binding=binding,
        python=VENV_PYTHON,
        kernel=KERNEL,
        setup=shlex.quote(VENV_ACTIVATE),
    )
    write_as_user(work / "notebook.sbatch", script)
    # the notebook job is submitted from a plain login environment, as a hub would
    login = [f"HOME=/home/{USER}", f"USER={USER}", "PATH=/usr/local/bin:/usr/bin:/bin"]
    submit = run_as_user(
        "env", "-i", *login, f"PYTHONPATH={REPO}", "LANG=C.UTF-8",
        "sbatch", "--parsable", "--export=ALL", str(work / "notebook.sbatch"),
    )  # fmt: skip
    notebook_job = submit.stdout.strip().split(";")[0]
    cluster_job = ""
    try:
        outer = wait_for(lambda: _event(work, "outer", notebook_job), 120, "the kernel to start")
        seen = outer["environ"]
        assert outer["host"] == "node1" and seen["SLURM_JOB_ID"] == notebook_job
        assert seen["SLURM_MEM_PER_NODE"] == "1024" and seen["SLURM_CPUS_PER_TASK"] == "1"
        assert {name: seen.get(name) for name in BINDING} == BINDING

        up = wait_for(lambda: _event(work, "up", notebook_job), 300, "the cluster to be up")
        cluster_job, job_dir = up["job_id"], up["job_dir"]
        assert cluster_job != notebook_job
        assert len(set(up["hosts"])) == 2, up["hosts"]  # a task ran on each node

        # nothing of the notebook job is in any process of the cluster, on any node
        pids = processes_of(job_dir)
        assert len(pids) > 10
        outer_only = [*BINDING, "SLURM_MEM_PER_NODE", "SLURM_JOB_NAME"]  # the cluster's differ
        # a step of the cluster that Slurm binds (task/affinity) has a binding of its own, whose
        # type and verbosity are the same words as the notebook's: its mask and list tell them
        alike_when_bound = ("SLURM_CPU_BIND_TYPE", "SLURM_CPU_BIND_VERBOSE")
        whole = 0
        for pid in pids:
            environ = ProcessEnvironment.of(pid)
            if environ is None:
                continue
            bound = any(name.startswith("SLURM_CPU_BIND") for name in environ.variables)
            names = [n for n in outer_only if not (bound and n in alike_when_bound)]
            assignments = [f"{name}={seen[name]}".encode() for name in names]
            leaked = [text for text in assignments if text in environ.block]
            assert leaked == [], (pid, leaked)
            assert "SLURM_MEM_PER_NODE" not in environ.variables  # the cluster asks no --mem
            if environ.whole:  # (a titled process lost the start of its block)
                whole += 1
                ids = {environ.variables.get(n) for n in ("SLURM_JOB_ID", "SLURM_JOBID")}
                assert ids == {cluster_job}, (pid, ids)
        assert whole > 10
        script = Path(job_dir, "job.sbatch").read_text()
        assert "SLURM_" not in script.split("--export=")[1].split("\n")[0]

        run_as_user("touch", str(work / "go"))
        down = wait_for(lambda: _event(work, "down", notebook_job), 120, "the kernel's down()")
        assert down["job_id"] == cluster_job
        wait_until_nothing_left(cluster_job, job_dir)
        wait_for(lambda: not in_queue(notebook_job), 60, "the notebook job to end")
    finally:
        named = {str(event["job_id"]) for event in _events(work) if event.get("job_id")}
        jobs = sorted({notebook_job, cluster_job, *named} - {""})
        subprocess.run(["scancel", *jobs], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--", str(work)], check=False)
