"""The kinds of scheduler there are, and which one a mode or a job id names.

Each kind is a :class:`Scheduler` registered as an entry point of the group
``jupyter_slurm_ray.schedulers``: its name is the ``ClusterSpec.mode`` that picks it, its value
``module:Class`` (as ipyparallel registers its launchers). The package registers its own three
in its pyproject.toml; a second batch system is one package (or folder) of its own and one
line of registration. The rest of the package asks the kind (``kind_for_mode``, ``kind_of``),
never which one it is.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from importlib.metadata import entry_points

from ..errors import SpecError
from .interface import Scheduler

__all__ = ["DEFAULT_MODE", "GROUP", "kind_for_mode", "kind_of", "kinds", "register"]

log = logging.getLogger(__name__)

GROUP = "jupyter_slurm_ray.schedulers"
#: the package's own kinds, as its pyproject.toml registers them: found even by an install
#: whose metadata predates them (an editable install not yet installed again)
BUILT_IN = {
    "slurm": "jupyter_slurm_ray.slurm.client:SlurmClient",
    "local": "jupyter_slurm_ray.slurm.localjobs:LocalJobs",
    "here": "jupyter_slurm_ray.slurm.heresteps:HereSteps",
}
#: the kind of a job id no other kind owns: Slurm's plain numbers
DEFAULT_MODE = "slurm"

_kinds: dict[str, type[Scheduler]] | None = None


def kinds() -> dict[str, type[Scheduler]]:
    """Every registered kind by its mode, the package's own first (loaded once)."""
    global _kinds
    if _kinds is None:
        found = dict(BUILT_IN)
        for point in entry_points(group=GROUP):
            found.setdefault(point.name, point.value)
        _kinds = {}
        for mode, value in found.items():
            kind = _load(mode, value, required=mode in BUILT_IN)
            if kind is not None:
                _kinds[mode] = kind
    return _kinds


def register(kind: type[Scheduler]) -> None:
    """Add (or replace) a kind at run time, as an entry point would: for tests and plugins
    that cannot be installed."""
    _check(kind.mode, kind)
    kinds()[kind.mode] = kind


def unregister(mode: str) -> None:
    """Remove a kind ``register`` added (the package's own stay)."""
    if mode not in BUILT_IN:
        kinds().pop(mode, None)


def kind_for_mode(mode: str) -> type[Scheduler]:
    """The kind a new cluster of ``mode`` runs on; SpecError naming the modes there are."""
    found = kinds().get(mode)
    if found is None:
        raise SpecError("mode", mode, f"one of {', '.join(map(repr, kinds()))}")
    return found


def kind_of(job_id: str | None) -> type[Scheduler]:
    """The kind whose job ``job_id`` is, by the form of its id (Slurm's when none owns it)."""
    if job_id:
        for mode, kind in kinds().items():
            if mode != DEFAULT_MODE and kind.owns(job_id):
                return kind
    return kinds()[DEFAULT_MODE]


def no_usage(job_ids: Sequence[str]) -> str:
    """Why accounting has no usage for a cluster's jobs ("": it has), asked of each job's kind."""
    for job_id in job_ids:
        why = kind_of(job_id).no_usage(job_ids)
        if why:
            return why
    return ""


def _load(mode: str, value: str, *, required: bool) -> type[Scheduler] | None:
    module, _, name = value.partition(":")
    try:
        kind = getattr(importlib.import_module(module), name)
        _check(mode, kind)
    except Exception as exc:
        if required:
            raise
        log.warning("scheduler %r (%s, entry point of %s) is left out: %s", mode, value, GROUP, exc)
        return None
    return kind


def _check(mode: str, kind: object) -> None:
    if not (isinstance(kind, type) and issubclass(kind, Scheduler)):
        raise TypeError(f"{kind!r} is not a jupyter_slurm_ray Scheduler")
    if getattr(kind, "mode", None) != mode:
        raise TypeError(f"{kind.__name__}.mode is {getattr(kind, 'mode', None)!r}, not {mode!r}")
