"""Which variables of the submitting environment a cluster's job gets: an explicit list.

The job script names every exported variable (``#SBATCH --export=A,B,…``), so
``cluster.script()`` shows exactly what reaches the job. Left out: credentials and tokens
(Ray's, JupyterHub's, anything named like a secret), Jupyter's kernel variables, and the
``SLURM_*``/``SBATCH_*``… variables of an allocation the kernel itself may run in, which
would otherwise override the new job's own. Values are never read or kept here, only names;
the user adds variables with the ``env`` setting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["DROPPED_PREFIXES", "SECRET_PATTERN", "drop_reason", "exported_names", "parse_env0"]

DROPPED_PREFIXES = (
    "RAY_AUTH_",  # the kernel's own Ray token settings: each cluster has its own token
    "JUPYTERHUB_",  # the hub's API token and the user's server URL
    "JPY_",  # the kernel's session and its parent's credentials
    "SLURM_",  # an outer allocation's: they would override the job's own (e.g. memory)
    "SBATCH_",
    "SALLOC_",
    "SRUN_",
    "JUPYTER_SLURM_RAY_",  # this package's client settings, not the job's
)
SECRET_PATTERN = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|APIKEY|API_KEY|PRIVATE_KEY|"
    r"ACCESS_KEY|AUTH",
    re.IGNORECASE,
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def drop_reason(name: str) -> str | None:
    """Why ``name`` is not exported to the job, or None when it is."""
    if not _NAME.fullmatch(name):
        return "not a plain variable name"
    for prefix in DROPPED_PREFIXES:
        if name.startswith(prefix):
            return f"{prefix}* is never exported"
    if SECRET_PATTERN.search(name):
        return "it is named like a secret"
    return None


def exported_names(names: Iterable[str]) -> list[str]:
    """The names, of ``names``, that the job gets: sorted, without the dropped ones."""
    return sorted({name for name in names if drop_reason(name) is None})


def parse_env0(output: str) -> tuple[str, list[str]]:
    """``printf '%s\\0' "$HOME"; env -0`` output → (home, variable names)."""
    home, _, rest = output.partition("\0")
    names = [item.partition("=")[0] for item in rest.split("\0") if "=" in item]
    return home, names
