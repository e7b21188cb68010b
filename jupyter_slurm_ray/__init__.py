"""jupyter_slurm_ray: start a Ray cluster inside a Slurm allocation and use it from Jupyter."""

from __future__ import annotations

from typing import Any

from . import display
from .errors import (
    CommandError,
    ConnectError,
    NoClusterError,
    RayStartError,
    SlurmError,
    SlurmRayError,
    SpecError,
    TransportError,
)

__all__ = [
    "ClusterSpec",
    "CommandError",
    "ConnectError",
    "LocalTransport",
    "NoClusterError",
    "RayStartError",
    "SSHTransport",
    "SlurmError",
    "SlurmRayCluster",
    "SlurmRayError",
    "SpecError",
    "TransportError",
    "__version__",
    "current",
    "load_ipython_extension",
    "panel",
]


_LAZY = {
    "ClusterSpec": "spec",
    "SlurmRayCluster": "cluster",
    "LocalTransport": "transport",
    "SSHTransport": "transport",
}


def __getattr__(name: str) -> Any:
    """The main classes, imported on first use (importing the package stays cheap), and
    ``__version__``."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name == "__version__":
        from .ui.version import installed_version  # light: the distribution's metadata

        return installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cluster_mimebundle(cluster: Any, include: Any, exclude: Any) -> dict[str, Any]:
    from .ui.reprs import cluster_mimebundle  # on first display: importing the package stays cheap

    return cluster_mimebundle(cluster, include, exclude)


def _status_line(status: Any) -> str:
    from .ui.formatting import status_line

    return status_line(status)


def _progress_bar(what: str, total: int) -> Any:
    try:
        from .ui.live import progress_bar
    except ImportError:  # no ipywidgets (a plain Python process): the caller's text progress
        return None
    return progress_bar(what, total)


display.set_renderer(_cluster_mimebundle, _status_line, _progress_bar)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_slurm_ray`` registers the ``%slurm_ray`` magics."""
    from .ui.magics import load_ipython_extension as load

    load(ipython)


def panel(**kwargs: Any) -> Any:
    """The cluster panel (``ClusterPanel``): a form, Up/Stop/Connect and live status."""
    from .ui.widget import ClusterPanel

    return ClusterPanel(**kwargs)


def current() -> Any:
    """This kernel's current cluster (started or attached by the magics or the panel), or None."""
    from .session import get_session

    return get_session().current
