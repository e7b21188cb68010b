"""The kinds of scheduler there are, and which one a mode or a job id names.

Each kind is a ``Scheduler`` (``interface.py``) registered under its mode (``modes.py``: an
entry point of ``jupyter_slurm_ray.schedulers``, or ``register`` at run time); a second batch
system is one package (or folder) of its own and one line of registration. The rest of the
package asks the kind (``kind_for_mode``, ``kind_of``) for its facts (``kind.py``), never which
one it is; what runs its jobs is made of it where a transport is (``slurm/schedulers.py``).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping, Sequence

from ..errors import SpecError
from . import modes
from .kind import EnclosingJob, SchedulerKind
from .modes import DEFAULT_MODE

__all__ = [
    "DEFAULT_MODE",
    "enclosing_job",
    "kind_for_mode",
    "kind_of",
    "kinds",
    "register",
    "unregister",
]

log = logging.getLogger(__name__)

_loaded: dict[str, type[SchedulerKind] | None] = {}  # "module:Class" -> its kind (None: broken)


def kinds() -> dict[str, type[SchedulerKind]]:
    """Every registered kind by its mode, the package's own first (each loaded once)."""
    found: dict[str, type[SchedulerKind]] = {}
    for mode, value in modes.registered().items():
        kind = value if isinstance(value, type) else _loaded_kind(mode, str(value))
        if kind is not None:
            found[mode] = kind
    return found


def register(kind: type[SchedulerKind]) -> None:
    """Add (or replace) a kind at run time, as an entry point would: for tests and plugins
    that cannot be installed."""
    _check(kind.mode, kind)
    modes.add(kind.mode, kind)


def unregister(mode: str) -> None:
    """Remove a kind ``register`` added (the package's own stay)."""
    modes.remove(mode)


def kind_for_mode(mode: str) -> type[SchedulerKind]:
    """The kind a new cluster of ``mode`` runs on; SpecError naming the modes there are."""
    found = kinds().get(mode)
    if found is None:
        raise SpecError("mode", mode, f"one of {', '.join(map(repr, kinds()))}")
    return found


def kind_of(job_id: str | None) -> type[SchedulerKind]:
    """The kind whose job ``job_id`` is, by the form of its id (Slurm's when none owns it)."""
    if job_id:
        for mode, kind in kinds().items():
            if mode != DEFAULT_MODE and kind.owns(job_id):
                return kind
    return kinds()[DEFAULT_MODE]


def enclosing_job(environ: Mapping[str, str] | None = None) -> EnclosingJob | None:
    """The job this process (or one with ``environ``) runs in, as the first kind that knows
    its environment says (None: it runs in none)."""
    environ = os.environ if environ is None else environ
    for kind in kinds().values():
        found = kind.enclosing(environ)
        if found is not None:
            return found
    return None


def no_usage(job_ids: Sequence[str]) -> str:
    """Why accounting has no usage for a cluster's jobs ("": it has), asked of each job's kind."""
    for job_id in job_ids:
        why = kind_of(job_id).no_usage(job_ids)
        if why:
            return why
    return ""


def _loaded_kind(mode: str, value: str) -> type[SchedulerKind] | None:
    if value not in _loaded:
        _loaded[value] = _load(mode, value, required=mode in modes.BUILT_IN)
    return _loaded[value]


def _load(mode: str, value: str, *, required: bool) -> type[SchedulerKind] | None:
    module, _, name = value.partition(":")
    try:
        kind = getattr(importlib.import_module(module), name)
        _check(mode, kind)
    except Exception as exc:
        if required:
            raise
        log.warning(
            "scheduler %r (%s, entry point of %s) is left out: %s", mode, value, modes.GROUP, exc
        )
        return None
    return kind


def _check(mode: str, kind: object) -> None:
    if not isinstance(kind, type) or not issubclass(kind, SchedulerKind):
        raise TypeError(f"{kind!r} is not a jupyter_slurm_ray Scheduler")
    if not callable(getattr(kind, "create", None)):  # facts alone: not a Scheduler
        raise TypeError(f"{kind!r} is not a jupyter_slurm_ray Scheduler")
    if getattr(kind, "mode", None) != mode:
        raise TypeError(f"{kind.__name__}.mode is {getattr(kind, 'mode', None)!r}, not {mode!r}")
