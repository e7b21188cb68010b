"""The modes a spec may ask for: one per kind of scheduler registered, read from the entry
points' names without importing a scheduler (``kinds.py`` loads the kinds themselves). The
spec's check of ``mode`` stands on this module alone, below every scheduler.

A kind is registered as an entry point of the group ``jupyter_slurm_ray.schedulers``: its name
is the ``ClusterSpec.mode`` that picks it, its value ``module:Class`` (as ipyparallel registers
its launchers). The package registers its own three in its pyproject.toml.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

__all__ = ["BUILT_IN", "DEFAULT_MODE", "GROUP", "add", "modes", "registered", "remove"]

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

_added: dict[str, object] = {}  # mode -> the kind ``add`` registered at run time


@cache
def installed() -> dict[str, str]:
    """The entry points of the group: mode -> ``module:Class`` (read once per process)."""
    return {point.name: point.value for point in entry_points(group=GROUP)}


def registered() -> dict[str, object]:
    """Each mode with what registers it, the package's own first: ``module:Class`` of an entry
    point, or the class added at run time."""
    found: dict[str, object] = dict(BUILT_IN)
    for mode, value in installed().items():
        found.setdefault(mode, value)
    return {**found, **_added}


def modes() -> tuple[str, ...]:
    """The modes there are: what ``ClusterSpec.mode`` accepts."""
    return tuple(registered())


def add(mode: str, kind: object) -> None:
    """Register ``kind`` as ``mode`` at run time, as an entry point would."""
    _added[mode] = kind


def remove(mode: str) -> None:
    """Take back what ``add`` registered (the package's own stay)."""
    _added.pop(mode, None)
