"""A notebook run by nbclient inside a Slurm job, as a notebook under batchspawner or Open
OnDemand runs: its kernel runs there too, so ``connect = "auto"`` makes it a Ray driver.

Run as the job's own process by tests/test_ray_docs_examples.py: ``python notebook_in_a_job.py
WORK NOTEBOOK PYTHON SETUP [MEM]``. Settings as scripts/quickstart gives a kernel (variables
only, the state dir in WORK); the executed notebook is saved as ``WORK/executed.ipynb``; one
JSON line ``ran`` in ``WORK/report.jsonl`` carries run-notebook's status and output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kernel_common import report_to

work, notebook, python, setup = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
mem = sys.argv[5] if len(sys.argv) > 5 else ""
REPO = Path(__file__).resolve().parents[2]
environment = {
    **os.environ,
    "JUPYTER_SLURM_RAY_STATE_DIR": str(work / "state"),
    "JUPYTER_SLURM_RAY_PYTHON": python,
    "JUPYTER_SLURM_RAY_SETUP": setup,
    "JUPYTER_SLURM_RAY_OBJECT_STORE_MEMORY": "200M",
    "JUPYTER_SLURM_RAY_CPUS_PER_NODE": "1",
    **({"JUPYTER_SLURM_RAY_MEM_PER_NODE": mem} if mem else {}),
}
try:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run-notebook"), notebook,
         "--save", str(work / "executed.ipynb"), "--timeout", "600"],
        env=environment, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report_to(
        work, "ran", status=done.returncode, out=done.stdout[-20000:], err=done.stderr[-5000:]
    )
except Exception as exc:
    report_to(work, "error", error=f"{type(exc).__name__}: {exc}")
