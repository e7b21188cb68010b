"""The installed distribution's version (``jupyter slurm-ray --version``, ``__version__``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["installed_version"]


def installed_version() -> str:
    """The version of the installed distribution, which the build took from its one place,
    ``labextension/package.json``; "0+unknown" for a source tree that was never installed."""
    try:
        return version("jupyter-slurm-ray")
    except PackageNotFoundError:
        return "0+unknown"
