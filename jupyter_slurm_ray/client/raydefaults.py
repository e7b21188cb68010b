"""Ray's defaults that name this machine, pointed at the cluster's side under Ray Client.

Ray Train and Tune keep results under ``~/ray_results`` by default, a path Ray works out in the
process that builds the run's configuration. Through Ray Client that is this kernel, while the
files are written on the cluster, as the job's user: a kernel on a laptop, or one whose user is
not the job's (a site's ``command_prefix``), gets ``PermissionError: Cannot create directory
'/root/ray_results/…'``. While this process is connected through Ray Client, Ray's default
names the cluster side's ``~/ray_results`` (the job user's home there) instead, in
``ray.train.constants`` and in the modules that copied it when they were imported; an explicit
``storage_path`` is left alone. Disconnecting puts Ray's value back.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import PurePosixPath

__all__ = ["results_here_again", "results_on_the_cluster"]

_CONSTANTS = "ray.train.constants"
_COPIES = ("ray.tune.experiment.experiment", "ray.tune.trainable.trainable")
_NAME = "DEFAULT_STORAGE_PATH"
_saved: dict[str, str] = {}


def results_on_the_cluster(cluster_home: str) -> str:
    """Ray's default results directory: ``<cluster_home>/ray_results`` from now on."""
    path = str(PurePosixPath(cluster_home) / "ray_results")
    try:
        importlib.import_module(_CONSTANTS)  # Ray's own value first (light: Ray is imported)
    except ImportError:  # ray[train] is not installed here: nothing names this machine
        return path
    for name in (_CONSTANTS, *_COPIES):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, _NAME):
            _saved.setdefault(name, getattr(module, _NAME))
            setattr(module, _NAME, path)
    return path


def results_here_again() -> None:
    """Ray's own default again (after a disconnect)."""
    for name, value in list(_saved.items()):
        module = sys.modules.get(name)
        if module is not None:
            setattr(module, _NAME, value)
        del _saved[name]
