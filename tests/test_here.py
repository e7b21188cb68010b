"""``--here`` on the real testbed: Ray on the nodes of the notebook's own allocation.

One notebook job for the whole file: ``sbatch -p solo -N3 -c2`` (all of the solo partition's 3
nodes × 2 CPUs) running a kernel's stand-in as alice on its first node
(tests/resources/kernel_here.py), which does what each test asks. A cluster brought up
``--here`` runs a task on each of the 3 hosts as steps of that allocation; ``down`` leaves the
allocation running and no Ray process on any node; the allocation's end (``scancel`` of it,
the last test) ends the cluster, which any other process then lists as CANCELLED, and leaves
nothing. Requests that do not fit the allocation are refused before anything starts.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .helpers.bootstrap import run_as_user, write_as_user
from .helpers.clusters import processes_of
from .helpers.jobs import in_queue, queue_state
from .helpers.paths import REPO, VENV_ACTIVATE, VENV_PYTHON
from .helpers.testbed import SOLO, USER
from .helpers.waiting import wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.ray, pytest.mark.solo]  # every CPU

KERNEL = REPO / "tests" / "resources" / "kernel_here.py"
NOTEBOOK_JOB = """#!/bin/bash
#SBATCH --job-name=jsr-here-notebook
#SBATCH --partition={partition} --nodes=3 --ntasks-per-node=1 --cpus-per-task=2 --time=20
#SBATCH --output={work}/notebook.out --error={work}/notebook.out
exec {python} {kernel} {work} {python} {setup}
"""


@dataclass
class Notebook:
    """The notebook job and its kernel: ``ask(action)`` returns the kernel's answer."""

    work: Path
    job_id: str
    asked: int = 0
    job_ids: list[str] = field(default_factory=list)  # the clusters' steps, for the cleanup

    def reports(self) -> list[dict]:
        path = self.work / "report.jsonl"
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def answer(self, n: int) -> dict | None:
        for event in self.reports():
            if event.get("n") == n:
                if event["event"] == "error":
                    raise AssertionError(f"the kernel failed:\n{event['error']}")
                return event
        if not in_queue(self.job_id):
            raise AssertionError(f"the notebook job ended:\n{self.output()[-3000:]}")
        return None

    def ask(self, action: str, timeout: float) -> dict:
        self.asked += 1
        n = self.asked
        write_as_user(self.work / f"ask-{n}", action + "\n")
        try:
            answer = wait_for(lambda: self.answer(n), timeout, f"the kernel's {action}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nthe kernel's output:\n{self.output()[-6000:]}") from None
        if answer.get("job_id"):
            self.job_ids.append(answer["job_id"])
        return answer

    def output(self) -> str:
        path = self.work / "notebook.out"
        return path.read_text() if path.exists() else ""


def steps_of(job_id: str) -> dict[str, str]:
    """The job's steps as squeue lists them: step id -> its name."""
    done = subprocess.run(
        ["squeue", "-h", "--steps", "-j", job_id, "-o", "%i|%j"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    rows = (line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
    return {step.strip(): name.strip() for step, name in rows}


def steps_named(job_id: str, name: str) -> list[str]:
    return [step for step, named in steps_of(job_id).items() if named == name]


@pytest.fixture(scope="module")
def notebook(solo_nodes) -> Iterator[Notebook]:
    work = Path(f"/home/{USER}/.jsr-here-{uuid.uuid4().hex[:8]}")
    run_as_user("mkdir", "-m", "700", str(work))
    script = NOTEBOOK_JOB.format(
        partition=SOLO,
        work=work,
        python=VENV_PYTHON,
        kernel=KERNEL,
        setup=shlex.quote(VENV_ACTIVATE),
    )
    write_as_user(work / "notebook.sbatch", script)
    login = [f"HOME=/home/{USER}", f"USER={USER}", "PATH=/usr/local/bin:/usr/bin:/bin"]
    submit = run_as_user(
        "env", "-i", *login, f"PYTHONPATH={REPO}", "LANG=C.UTF-8",
        "sbatch", "--parsable", "--export=ALL", str(work / "notebook.sbatch"),
    )  # fmt: skip
    book = Notebook(work, submit.stdout.strip().split(";")[0])
    try:
        outer = wait_for(lambda: book.reports(), 120, "the kernel to start")[0]
        assert outer["event"] == "outer" and outer["host"] == solo_nodes[0]
        assert outer["environ"]["SLURM_JOB_ID"] == book.job_id
        yield book
    finally:
        subprocess.run(["scancel", book.job_id], check=False, capture_output=True)
        wait_for(lambda: not in_queue(book.job_id), 60, "the notebook job to end")
        steps = Path(f"/home/{USER}/.jupyter-slurm-ray/here-steps")
        subprocess.run(["rm", "-rf", "--", str(work), *steps.glob(f"here-{book.job_id}-*")])


def test_requests_the_allocation_cannot_hold_are_refused_before_anything_starts(
    notebook, solo_nodes
):
    answer = notebook.ask("refuse", 60)
    refused = answer["refused"]
    assert refused["nodes"]["field"] == "here_nodes"
    assert "at most 3 nodes" in refused["nodes"]["message"]
    held = f"allocation {notebook.job_id} has 3: {', '.join(solo_nodes)}"
    assert held in refused["nodes"]["message"]
    assert (
        refused["gpus"]["field"] == "gpus_per_node" and "holds 0 GPUs" in refused["gpus"]["message"]
    )
    assert refused["partition"]["field"] == "partition"
    assert answer["records"] == 0 and answer["runner_files"] == []  # nothing started
    assert not any(name.startswith("here-") for name in steps_of(notebook.job_id).values())
    assert queue_state(notebook.job_id) == "RUNNING"


@pytest.mark.compat
def test_up_here_runs_a_task_on_each_host_and_down_leaves_the_allocation(notebook, solo_nodes):
    up = notebook.ask("up", 300)
    job_id, job_dir = up["job_id"], up["job_dir"]
    assert job_id.startswith(f"here-{notebook.job_id}-")
    assert up["hosts"] == list(solo_nodes)  # a task ran on each node
    assert up["here_nodes"] == ",".join(solo_nodes)  # the kernel's node is the head
    assert up["connect"][0] == "driver", up["connect"]  # auto: a kernel in the allocation
    assert len(steps_named(notebook.job_id, job_id)) == 2  # the head's step, the workers'
    assert len(processes_of(job_dir)) > 10

    down = notebook.ask("down", 120)
    assert down["state"] == "STOPPED"
    assert queue_state(notebook.job_id) == "RUNNING"  # the notebook's allocation runs on
    wait_for(lambda: not processes_of(job_dir), 30, "no Ray process left on any node")
    wait_for(lambda: not steps_named(notebook.job_id, job_id), 30, "the steps to end")
    assert notebook.ask("ping", 30)["host"] == solo_nodes[0]  # and the notebook itself runs on


def test_the_allocations_end_ends_the_cluster_truthfully_and_leaves_nothing(notebook, solo_nodes):
    up = notebook.ask("up", 300)
    job_id, job_dir = up["job_id"], up["job_dir"]
    assert up["hosts"] == list(solo_nodes)
    subprocess.run(["scancel", notebook.job_id], check=True)  # the allocation, kernel and all
    wait_for(lambda: not in_queue(notebook.job_id), 60, "the allocation to end")
    wait_for(lambda: not processes_of(job_dir), 30, "no Ray process left on any node")
    # another process (the CLI on the login node) lists the cluster as Slurm ended it
    listing = run_as_user(
        "env", f"JUPYTER_SLURM_RAY_STATE_DIR={notebook.work}/state", f"PYTHONPATH={REPO}",
        str(VENV_PYTHON), "-c",
        "from jupyter_slurm_ray.ui.cli import main; main(['list', '--all'])",
    ).stdout  # fmt: skip
    line = next(line for line in listing.splitlines() if job_id in line)
    assert "CANCELLED" in line.split(), listing
