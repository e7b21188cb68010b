"""Where things are: the checkout, the venv the tests run from, test artifacts.

The venv is the one running the tests (``scripts/run-tests`` uses ``$JSR_VENV``, by default
``/opt/jupyter-slurm-ray/venv``); the testbed's compute nodes run Ray from the same venv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
VENV_PYTHON = VENV / "bin" / "python"
VENV_ACTIVATE = f"source {VENV}/bin/activate"  # a setup line: Ray from this venv
ARTIFACTS = REPO / "test-artifacts"  # screenshots, logs, fault figures (kept by CI)
# A sticky dir that jobs on every node see, also where each job has a /tmp of its own
# (job_container/tmpfs, the trixie flavour's): its default Dirs=/tmp,/dev/shm leave /var/tmp
# the node's
NODES_SEE = "/var/tmp"
# where the bootstrap makes the user's private dirs (bootstrap/trust.py user_temp_dir): /tmp,
# and /var/tmp for what the user's jobs share on a node whose jobs have a /tmp of their own
USER_TEMP_PARENTS = ("/tmp", NODES_SEE)


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child Python that imports ``tests.helpers`` (run it
    as ``python -m tests.helpers.NAME`` or ``python -c``), plus ``extra``."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(extra or {})}
