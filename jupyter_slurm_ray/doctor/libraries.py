"""doctor's check of what Ray Data, Train and Tune import beside Ray (numpy, pandas, pyarrow):
on the test job's node as in this kernel. A task that uses one fails on a node that lacks it,
with an ImportError from the middle of Ray's library; told here, with what to install."""

from __future__ import annotations

import contextlib
from importlib import metadata
from typing import Any

from ..client.connect import local_versions
from ..spec import ClusterSpec
from .testjob import RAY_LIBRARY_DEPENDENCIES

__all__ = ["kernel_libraries", "libraries_verdict"]


def kernel_libraries() -> dict[str, str]:
    """The versions of Ray's libraries' dependencies this kernel has (none imported)."""
    found = {}
    for name in RAY_LIBRARY_DEPENDENCIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def libraries_verdict(
    spec: ClusterSpec, node: dict[str, Any] | None, here: dict[str, str] | None = None
) -> tuple[str, str, str]:
    """(status, detail, fix) of the node's (``node``: the test job's report of its Python)
    against this kernel's (``here``, by default read from this environment)."""
    here = kernel_libraries() if here is None else here
    if not here:
        return "skip", "this kernel has none of numpy, pandas, pyarrow", ""
    if spec.environment == "pack":
        return "ok", "the pack carries this kernel's environment", ""
    there = node.get("libraries") if node else None
    if not isinstance(there, dict):
        why = "Ray runs in the image" if spec.container else "the cluster's Python did not run"
        return "skip", f"not checked: {why}", ""
    missing = [name for name in here if not there.get(name)]
    other = [
        f"{n} {there[n]} (here {here[n]})" for n in here if there.get(n) not in (None, here[n])
    ]
    if missing or other:
        words = [f"the node lacks {', '.join(missing)}"] if missing else []
        words += [f"has {', '.join(other)}"] if other else []
        fix = (
            f"install ray[default,data,train,tune]=={local_versions()[0]} (which brings them) in "
            "the cluster's Python, with this kernel's versions, or set python/setup to such an "
            "environment"
        )
        return "warn", "; ".join(words), fix
    shown = ", ".join(f"{name} {version}" for name, version in here.items())
    return "ok", f"{shown}, as here", ""
