"""The testbed as a configured site: a profiles file, JUPYTER_SLURM_RAY_* settings, cleanup.

Kernels and tests run as root on the login node; clusters are submitted as the unprivileged
test user through ``SlurmRay.command_prefix`` (``runuser -u alice --``), so job dirs, file modes
and token auth are the real user's. The cluster side runs Ray from this venv.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

VENV = sys.prefix
USER = os.environ.get("JSR_USER", "alice")

PROFILES = f"""
[profiles.testbed]
description = "a small cluster on the project's testbed, Ray from the test venv"
python = "{VENV}/bin/python"
setup = ["source {VENV}/bin/activate"]
object_store_memory = "200M"
cpus_per_node = 1
time = "10"

[profiles.gpu-small]
description = "one fake GPU per node"
python = "{VENV}/bin/python"
setup = ["source {VENV}/bin/activate"]
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
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX": f"runuser -u {USER} --",
        "JUPYTER_SLURM_RAY_POLL_INTERVAL": "0.5",
    }


def kernel_environment(directory: Path) -> dict[str, str]:
    """Site settings as variables only (no profile): what scripts/quickstart sets for kernels."""
    return {
        "JUPYTER_SLURM_RAY_STATE_DIR": str(directory / "state"),
        "JUPYTER_SLURM_RAY_COMMAND_PREFIX": f"runuser -u {USER} --",
        "JUPYTER_SLURM_RAY_PYTHON": f"{VENV}/bin/python",
        "JUPYTER_SLURM_RAY_SETUP": f"source {VENV}/bin/activate",
        "JUPYTER_SLURM_RAY_OBJECT_STORE_MEMORY": "200M",
        "JUPYTER_SLURM_RAY_CPUS_PER_NODE": "1",
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


def jobs_named(name: str) -> list[str]:
    """Ids of the test user's jobs called ``name``, queued, running or recently ended."""
    out = subprocess.run(
        ["runuser", "-u", USER, "--", "squeue", "-h", "-t", "all", "-n", name, "-o", "%i"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (Key=Value pairs)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], check=True, capture_output=True, text=True
    ).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)
