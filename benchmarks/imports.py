"""CPU seconds a new Python process of the venv spends on its imports, with the deferral of
``client/deferral.py`` (the venv's ``.pth`` line, the kernel's, the cluster's sitecustomize) and
without it (the baseline, in the same run: the deferral taken out first thing in the process).

What is measured is what each such process pays before its first line of work: ``import ray``
(a kernel that connects, every Ray process on a node), Jupyter Server's application (every
Jupyter server, the hub's single-user servers among them). Runs anywhere the venv is:
    /opt/jupyter-slurm-ray/venv/bin/python benchmarks/imports.py
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results import write_result
from jupyter_slurm_ray.client.deferral import defer_costly_imports
from tests.helpers.deferral import UNDEFERRED

DEFERRED = (
    "from jupyter_slurm_ray.client.deferral import defer_costly_imports\ndefer_costly_imports()\n"
)
IMPORTS = {"import ray": "import ray\n", "Jupyter Server": "import jupyter_server.serverapp\n"}


def cpu_seconds(program: str) -> float:
    """User + system CPU of one new interpreter running ``program``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_cpu(program: str, repeats: int) -> float:
    return statistics.median(cpu_seconds(program) for _ in range(repeats))


def main(repeats: int) -> None:
    defer_costly_imports()  # this process's own imports do not count; the children's do
    figures: dict[str, float] = {}
    for label, code in IMPORTS.items():
        baseline = median_cpu(UNDEFERRED + code, repeats)
        ours = median_cpu(UNDEFERRED + DEFERRED + code, repeats)
        ratio = ours / baseline
        figures[f"{label}: baseline CPU s"] = round(baseline, 3)
        figures[f"{label}: deferred CPU s"] = round(ours, 3)
        figures[f"{label}: ratio"] = round(ratio, 2)
        print(f"{label:15s} baseline {baseline:5.2f} s  deferred {ours:5.2f} s  ratio {ratio:.2f}")
    write_result("imports", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each (median)")
    main(parser.parse_args().repeats)
