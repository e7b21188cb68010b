"""The names that tie a cluster's pieces together: its id, its Slurm job tag, its target name,
the id of its head step in a kernel's allocation (``--here``).

One definition each, used by the job script, the registry, the inventory and the server.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping
from typing import Any

from .errors import SlurmError

#: A cluster id: 4 to 64 of a-z 0-9 -, starting with a letter or digit (a file name, a URL
#: segment and a job comment at once, so nothing that needs quoting anywhere).
CLUSTER_ID = re.compile(r"[a-z0-9][a-z0-9-]{3,63}", re.ASCII)
CLUSTER_ID_ALLOWED = "4 to 64 of a-z 0-9 -, starting with a letter or digit"

#: The job comment the job script sets: JOB_TAG + cluster id. It finds our jobs in Slurm.
JOB_TAG = "jupyter-slurm-ray:"

#: The job comment of a cluster's extra worker jobs (scaling): WORKER_JOB_TAG + cluster id.
WORKER_JOB_TAG = "jupyter-slurm-ray-worker:"

#: The dashboard proxy's route under a Jupyter server's base URL (server/proxy.py).
DASHBOARD_ROUTE = "slurm-ray/dashboard"

#: Where the server extension keeps its dashboard capabilities, in its web app's settings
#: (server/capabilities.py); `jupyter slurm-ray dashboard` (ui/dashboardserver.py) mints one.
CAPABILITIES_SETTING = "slurm_ray_capabilities"

#: Set by the Jupyter server extension for its kernels: the dashboard proxy's URL prefix.
DASHBOARD_BASE_ENV = "JUPYTER_SLURM_RAY_DASHBOARD_BASE"

#: Any scheduler's job id, as a record may hold it (each kind says which are its own: ``owns``):
#: one word, never an option (Slurm's ``1234``, ``1234_7``, ``local-<pid>``, ``here-…``).
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}", re.ASCII)
JOB_ID_ALLOWED = "a job id (letters, digits and _ . + -, a letter or digit first)"
#: The job id of a cluster's head step in its kernel's own allocation (mode 'here', see
#: slurm/heresteps.py): ``here-<allocation>-<runner pid>``, never a Slurm job id.
HERE_JOB_ID = re.compile(r"here-([0-9]+(?:_[0-9]+)?)-([0-9]+)", re.ASCII)


def is_here_job_id(job_id: object) -> bool:
    """``here-<allocation>-<pid>``: the id of a cluster's head step in its kernel's allocation."""
    return isinstance(job_id, str) and HERE_JOB_ID.fullmatch(job_id.strip()) is not None


def allocation_of(job_id: str) -> str:
    """The allocation (a Slurm job id) a here-step id names."""
    match = HERE_JOB_ID.fullmatch(job_id.strip())
    if match is None:
        raise SlurmError(f"not the id of a --here step: {job_id!r} (expected here-<job>-<pid>)")
    return match.group(1)


def is_cluster_id(value: object) -> bool:
    return isinstance(value, str) and CLUSTER_ID.fullmatch(value) is not None


def new_cluster_id(name: str) -> str:
    """``"My Analysis"`` → ``"my-analysis-1f2e3d4c"``."""
    stem = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:24] or "ray"
    return f"{stem}-{secrets.token_hex(4)}"


def job_comment(cluster_id: str) -> str:
    return JOB_TAG + cluster_id


def worker_job_comment(cluster_id: str) -> str:
    return WORKER_JOB_TAG + cluster_id


def cluster_id_of_worker_comment(comment: str) -> str | None:
    """The cluster id a worker job's comment tags, or None for any other job."""
    comment = comment.strip()
    return comment[len(WORKER_JOB_TAG) :] if comment.startswith(WORKER_JOB_TAG) else None


def cluster_id_of_comment(comment: str) -> str | None:
    """The cluster id a job comment tags, or None for a job that is not ours."""
    comment = comment.strip()
    return comment[len(JOB_TAG) :] if comment.startswith(JOB_TAG) else None


def local_mode_target(target: str) -> str:
    """The target a local-mode cluster's record names: ``local mode`` and the user this
    machine's transport acts as (``local mode (runuser -u alice --)``), beside Slurm's."""
    return "local mode" + target.removeprefix("local")


def target_name(target: str | Mapping[str, Any]) -> str:
    """The name of a record's target, also for records of older versions that stored a dict.

    Only a name: a transport is never built from a record (see ``targets.Transports``).
    """
    if isinstance(target, str):
        return target
    if not isinstance(target, Mapping):
        return "?"
    kind = target.get("kind")
    if kind == "local":
        prefix = target.get("command_prefix") or ()
        if isinstance(prefix, list | tuple) and all(isinstance(w, str) for w in prefix):
            return "local" + (f" ({shlex.join(prefix)})" if prefix else "")
        return "local (?)"
    if kind == "ssh":
        user, host, port = target.get("username"), target.get("host", "?"), target.get("port")
        return f"ssh://{user + '@' if user else ''}{host}{f':{port}' if port else ''}"
    return "?"
