"""The example notebooks run clean under nbclient (through scripts/run-notebook) on the testbed.

Kernels run as root on the login node, configured only by JUPYTER_SLURM_RAY_* variables as
scripts/quickstart configures them: clusters are submitted as the test user through
``command_prefix`` and run Ray from this venv.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .helpers.site import cancel_recorded_jobs, kernel_environment
from .helpers.testbed import node_ip_pattern

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def run_notebook(name: str, tmp_path: Path) -> tuple[str, nbformat.NotebookNode]:
    environment = {**os.environ, **kernel_environment(tmp_path)}
    executed = tmp_path / name
    try:
        result = subprocess.run(
            [sys.executable, ROOT / "scripts" / "run-notebook", ROOT / "notebooks" / name,
             "--save", executed],
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
    finally:
        cancel_recorded_jobs(tmp_path / "state")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, nbformat.read(executed, as_version=4)


def outputs_of(notebook: nbformat.NotebookNode, source_start: str) -> list[dict]:
    cell = next(c for c in notebook.cells if c.source.startswith(source_start))
    return cell.outputs


def test_quickstart_runs_a_task_on_every_node(testbed, tmp_path):
    out, notebook = run_notebook("quickstart.ipynb", tmp_path)
    hosts = re.search(r"^hosts: \[(.*)\]$", out, re.M)
    assert hosts is not None, out
    names = re.findall(r"'(node\d+)'", hosts.group(1))
    assert len(names) == 2 and len(set(names)) == 2
    assert re.search(rf"^direct: https://{node_ip_pattern()}:\d+/$", out, re.M)  # the relay
    assert re.search(r"^ray \(ray-[0-9a-f]+\): STOPPED", out, re.M)
    up = outputs_of(notebook, "%slurm_ray up")
    assert any(WIDGET_VIEW in o.get("data", {}) for o in up)  # the live status widget
    assert any("CONNECTED" in o.get("text", "") for o in up)  # and the summary line


def test_gpus_and_profiles_sees_one_gpu_per_task(testbed, tmp_path):
    out, _ = run_notebook("gpus_and_profiles.ipynb", tmp_path)
    assert re.search(r"^gpus_per_node +1 +argument$", out, re.M)
    assert re.search(r"^nodes +2 +profile gpu-small$", out, re.M)
    assert "GPUs in the cluster: 2.0" in out
    tasks = re.findall(r"^(node\d+): ray.get_gpu_ids\(\)=\['(\d)'\]", out, re.M)
    assert len(tasks) == 2 and len({host for host, _ in tasks}) == 2, out
