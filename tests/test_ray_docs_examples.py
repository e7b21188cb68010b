"""Ray's own documentation examples run as written, ``ray.init()`` left in, in both connect
modes, as executed notebooks (``notebooks/ray_docs_examples.ipynb``: Ray Core's tasks, what a
task prints, and actors, Ray Data, Ray Tune, Ray Jobs; only its ``%slurm_ray up`` line is not
Ray's).

- Ray Client: the notebook run by nbclient on the login node, as scripts/quickstart runs one.
  Ray Data does not run through Ray Client: its cell shows the one line that says so.
- A Ray driver: the same notebook run by nbclient inside a Slurm job, as a notebook under
  batchspawner or Open OnDemand runs (its kernel there; ``connect = "auto"`` chooses driver).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.ui.clientlimits import ray_data_through_client

from .helpers.notebookjob import NotebookJob
from .helpers.paths import REPO, VENV_ACTIVATE, VENV_PYTHON
from .helpers.site import cancel_recorded_jobs, kernel_environment
from .helpers.testbed import ENFORCED

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

NOTEBOOK = REPO / "notebooks" / "ray_docs_examples.ipynb"


def cell_text(notebook: nbformat.NotebookNode, source_start: str) -> str:
    """What the first cell whose source contains ``source_start`` printed, errors included."""
    cell = next(c for c in notebook.cells if source_start in c.source)
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] == "error":
            parts.append("\n".join([*output["traceback"], f"{output['ename']}"]))
        else:  # a display: its text, or its HTML's (the live status of up)
            data = output.get("data", {})
            html = re.sub(r"<[^>]+>", " ", data.get("text/html", ""))
            parts.append(data.get("text/plain", "") + "\n" + html)
    return "".join(parts)


def assert_rays_examples_ran(notebook: nbformat.NotebookNode) -> None:
    assert "[0, 1, 4, 9]" in cell_text(notebook, "def square(x)")
    # what the task printed shows under the cell that waited for it, not under the next one
    printed = re.sub(r"\x1b\[[0-9;]*m", "", cell_text(notebook, "def task():"))  # Ray's colours
    assert re.search(r"\(task pid=\d+[^)]*\) task", printed), printed[-2000:]
    assert "(task pid=" not in cell_text(notebook, "class Counter")
    assert cell_text(notebook, "class Counter").split()[-1] == "10"
    best = cell_text(notebook, "tune.Tuner(objective")
    assert re.search(r"\{'a': (0\.001|0\.01|0\.1|1\.0), 'b': [123]\}", best), best[-2000:]
    jobs = cell_text(notebook, "JobSubmissionClient(")
    assert "status: SUCCEEDED" in jobs and "'CPU'" in jobs, jobs  # the job's driver's print
    assert "STOPPED" in cell_text(notebook, "%slurm_ray down")


def test_through_ray_client_from_the_login_node(testbed, tmp_path):
    executed = tmp_path / "executed.ipynb"
    try:
        done = subprocess.run(
            [sys.executable, REPO / "scripts" / "run-notebook", NOTEBOOK, "--save", executed],
            env={**os.environ, **kernel_environment(tmp_path)},
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        cancel_recorded_jobs(tmp_path / "state")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    notebook = nbformat.read(executed, as_version=4)
    assert "Ray Client (auto:" in done.stdout, done.stdout[-5000:]
    assert_rays_examples_ran(notebook)
    data = cell_text(notebook, "ray.data.range(1000)")
    (record,) = Registry(tmp_path / "state").all()
    assert ray_data_through_client(record.name) in data, data
    assert "Traceback" not in data


def test_as_a_driver_in_a_notebook_job(testbed):
    # where the testbed enforces memory, the kernel, its Ray node, Data and Tune need room
    job = NotebookJob.submit(
        "notebook_in_a_job.py", str(NOTEBOOK), str(VENV_PYTHON), VENV_ACTIVATE,
        "2G" if ENFORCED else "", mem="4G" if ENFORCED else "2G",
    )  # fmt: skip
    try:
        ran = job.wait("ran", 900)
        assert ran["status"] == 0, ran["out"][-5000:] + ran["err"][-3000:]
        notebook = nbformat.read(Path(job.work, "executed.ipynb"), as_version=4)
    finally:
        job.clean_up()
    assert "Ray driver (auto: this kernel runs in Slurm job" in ran["out"], ran["out"][-5000:]
    assert_rays_examples_ran(notebook)
    assert cell_text(notebook, "ray.data.range(1000)").split()[-1] == "999000"
