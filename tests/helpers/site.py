"""The testbed as a configured site: a profiles file, JUPYTER_SLURM_RAY_* settings, cleanup.

Kernels and tests run as root on the login node; clusters are submitted as the unprivileged
test user through ``SlurmRay.command_prefix`` (``runuser -u alice --``), so job dirs, file modes
and token auth are the real user's. The cluster side runs Ray from this venv.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .paths import VENV_ACTIVATE, VENV_PYTHON
from .testbed import ENFORCED_MEMORY, USER, runuser

PROFILES = f"""
[profiles.testbed]
description = "a small cluster on the project's testbed, Ray from the test venv"
python = "{VENV_PYTHON}"
setup = ["{VENV_ACTIVATE}"]
object_store_memory = "200M"
cpus_per_node = 1
time = "10"

[profiles.gpu-small]
description = "one fake GPU per node"
python = "{VENV_PYTHON}"
setup = ["{VENV_ACTIVATE}"]
object_store_memory = "200M"
cpus_per_node = 1
gpus_per_node = 1
time = "10"
"""


def write_profiles(directory: Path) -> Path:
    path = directory / "slurm_ray_profiles.toml"
    path.write_text(PROFILES)
    return path


def site_environment(directory: Path) -> dict[str, str]:
    """The variables that make jupyter_slurm_ray use the testbed as the test user."""
    return {
        "JUPYTER_SLURM_RAY_STATE_DIR": str(directory / "state"),
        "JUPYTER_SLURM_RAY_PROFILES_FILE": str(write_profiles(directory)),
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX": " ".join(runuser(USER)),
        "JUPYTER_SLURM_RAY_POLL_INTERVAL": "0.5",
        **memory_setting(),
    }


def memory_setting() -> dict[str, str]:
    """Where the testbed enforces memory as a site does: what the tests' clusters ask for."""
    return {"JUPYTER_SLURM_RAY_MEM_PER_NODE": ENFORCED_MEMORY} if ENFORCED_MEMORY else {}


def kernel_environment(directory: Path) -> dict[str, str]:
    """Site settings as variables only (no profile): what scripts/quickstart sets for kernels."""
    return {
        "JUPYTER_SLURM_RAY_STATE_DIR": str(directory / "state"),
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX": " ".join(runuser(USER)),
        "JUPYTER_SLURM_RAY_PYTHON": str(VENV_PYTHON),
        "JUPYTER_SLURM_RAY_SETUP": VENV_ACTIVATE,
        "JUPYTER_SLURM_RAY_OBJECT_STORE_MEMORY": "200M",
        "JUPYTER_SLURM_RAY_CPUS_PER_NODE": "1",
        **memory_setting(),
    }


@contextlib.contextmanager
def configured_site(directory: Path) -> Iterator[dict[str, str]]:
    """Set the site's variables in this process (and its children) for the duration."""
    environment = site_environment(directory)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        try:
            yield environment
        finally:
            cancel_recorded_jobs(Path(environment["JUPYTER_SLURM_RAY_STATE_DIR"]))


def recorded_job_ids(state_dir: Path) -> list[str]:
    ids = []
    for path in (state_dir / "clusters").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            job_id = json.loads(path.read_text()).get("job_id")
            if job_id:
                ids.append(str(job_id))
    return ids


def cancel_recorded_jobs(state_dir: Path) -> None:
    """Safety net: cancel every job a test's registry knows (finished ones are ignored)."""
    ids = recorded_job_ids(state_dir)
    if ids:
        subprocess.run(["scancel", *ids], check=False, capture_output=True)
