"""Which variables of the submitting environment a cluster's job gets: an allow-list.

The job script names every exported variable (``#SBATCH --export=A,B,…``), so
``cluster.script()`` shows exactly what reaches the job from here. What goes:

- :data:`DEFAULT_EXPORT`, a small list: where programs and libraries come from (``PATH``,
  ``LD_LIBRARY_PATH``, ``PYTHONPATH``, an active venv or conda env), who and where (``HOME``,
  ``USER``, ``LOGNAME``, ``TMPDIR``), language and time (``LANG``, ``LC_*``, ``TZ``), and the
  module systems' state (Lmod, Environment Modules: ``MODULEPATH``, ``LMOD_*``,
  ``LOADEDMODULES``, ``BASH_ENV``…) so that ``module load`` works in the setup lines;
- what the user names in the ``export_env`` setting: names, or glob patterns (``MYAPP_*``).

Everything else stays out, whatever its name: ``DATABASE_URL``, a proxy URL with a password,
``KUBECONFIG``, ``GH_PAT``, ``NETRC``, ``KRB5CCNAME``… The ``env`` setting's variables are set
in the script itself, and Slurm sets the job's own (``SLURM_*``, ``CUDA_VISIBLE_DEVICES`` and
the other GPU variables of the GPUs it gave the job). Never exported, even when named: Slurm's
variables (they would override the job's own: ``bootstrap/slurmenv.py``), Ray's token settings
(each cluster has its own token), the hub's and Jupyter's (API tokens, the kernel's session)
and this package's client settings. A pattern never brings in a name that looks like a secret
(``…TOKEN``, ``…PASSWORD``, ``…_KEY``…): name such a variable exactly to export it.
Values are never read or kept here, only names. The ``export_env`` setting is checked here too
(``export_env_entries``): a name that is never exported is refused when the spec is made.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..bootstrap.slurmenv import is_slurm_variable
from ..errors import SpecError

__all__ = [
    "DEFAULT_EXPORT",
    "NEVER_PREFIXES",
    "SECRET_PATTERN",
    "drop_reason",
    "export_env_entries",
    "exported_names",
    "is_pattern",
    "never_reason",
    "parse_env0",
]

DEFAULT_EXPORT = (
    # where programs and libraries come from
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    # who and where
    "HOME",
    "USER",
    "LOGNAME",
    "TMPDIR",
    # language and time
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    # module systems: Lmod and Environment Modules (`module load` in the setup lines)
    "MODULEPATH",
    "MODULEPATH_ROOT",
    "MODULESHOME",
    "LOADEDMODULES",
    "_LMFILES_",
    "LMOD_*",
    "__LMOD_*",
    "_ModuleTable*",
    "MODULES_*",
    "__MODULES_*",
    "BASH_ENV",
)
NEVER_PREFIXES = {
    "RAY_AUTH_": "Ray's token settings: each cluster has its own token",
    "JUPYTERHUB_": "the hub's API token and URLs are the notebook server's, not a job's",
    "JPY_": "the kernel's session and its parent's credentials stay with the kernel",
    "JUPYTER_SLURM_RAY_": "this package's settings are the client's, not the job's",
}
SECRET_PATTERN = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|APIKEY|API_KEY|PRIVATE_KEY|"
    r"ACCESS_KEY|AUTH|_PAT$|COOKIE|SESSION",
    re.IGNORECASE,
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_WILDCARDS = re.compile(r"[*?\[]")


def is_pattern(entry: str) -> bool:
    """True for a glob pattern (``*``, ``?``, ``[…]``), False for a plain name."""
    return bool(_WILDCARDS.search(entry))


def never_reason(name: str) -> str | None:
    """Why ``name`` is never exported to a job, even when named, or None."""
    if is_slurm_variable(name):
        return "Slurm's variables are never exported: Slurm sets the job's own"
    for prefix, reason in NEVER_PREFIXES.items():
        if name.startswith(prefix):
            return f"{prefix}* is never exported: {reason}"
    return None


def drop_reason(name: str, export_env: Sequence[str] = ()) -> str | None:
    """Why ``name`` is not exported to the job (with ``export_env`` named), or None."""
    if not _NAME.fullmatch(name):
        return "not a plain variable name"
    never = never_reason(name)
    if never:
        return never
    if name in export_env or name in DEFAULT_EXPORT:
        return None
    patterns = [p for p in (*DEFAULT_EXPORT, *export_env) if is_pattern(p)]
    if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
        return "not in the default list nor in export_env"
    if SECRET_PATTERN.search(name):
        return "it is named like a secret: a pattern never exports it, name it in export_env"
    return None


def exported_names(names: Iterable[str], export_env: Sequence[str] = ()) -> list[str]:
    """The names, of ``names``, that the job gets: sorted, the allowed ones only."""
    return sorted({name for name in names if drop_reason(name, export_env) is None})


# ----------------------------------------------------------------------------- the setting

_EXPORT_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]!-]+", re.ASCII)
_EXPORT_SEPARATORS = re.compile(r"[\s,]+")
_EXPORT_ALLOWED = (
    "variable names (A-Z a-z 0-9 _) or glob patterns (MYAPP_*, *_HOME, with * ? [ ]), "
    "as a list or one string separated by commas or spaces"
)


def export_env_entries(field: str, value: Any) -> tuple[str, ...]:
    """The ``export_env`` setting: the variables a job gets besides the default list
    (above); a name (or a pattern's fixed start) that is never exported is refused,
    saying why."""
    if isinstance(value, str):
        value = [entry for entry in _EXPORT_SEPARATORS.split(value) if entry]
    entries = _names(field, value)
    for entry in entries:
        plain = not is_pattern(entry)
        if not (_NAME if plain else _EXPORT_PATTERN).fullmatch(entry):
            raise SpecError(field, entry, _EXPORT_ALLOWED)
        never = never_reason(entry if plain else _WILDCARDS.split(entry, maxsplit=1)[0])
        if never:
            raise SpecError(field, entry, f"another variable: {never}")
    return tuple(dict.fromkeys(entries))


def _names(field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise SpecError(field, value, _EXPORT_ALLOWED)


def parse_env0(output: str) -> tuple[str, list[str]]:
    """``printf '%s\\0' "$HOME"; env -0`` output → (home, variable names)."""
    home, _, rest = output.partition("\0")
    names = [item.partition("=")[0] for item in rest.split("\0") if "=" in item]
    return home, names
