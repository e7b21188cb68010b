"""jupyter_slurm_ray: start a Ray cluster inside a Slurm allocation and use it from Jupyter."""

from __future__ import annotations

from .errors import (
    CommandError,
    ConnectError,
    RayStartError,
    SlurmError,
    SlurmRayError,
    SpecError,
    TransportError,
)

__version__ = "0.1.0"

__all__ = [
    "CommandError",
    "ConnectError",
    "RayStartError",
    "SlurmError",
    "SlurmRayError",
    "SpecError",
    "TransportError",
    "__version__",
]
