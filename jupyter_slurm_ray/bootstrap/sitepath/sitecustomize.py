"""Run by every Python process Ray starts for the cluster (this directory is first on their
PYTHONPATH): imports that cost seconds and are rarely used are deferred to their first use
(``jsr_deferred``: a Ray node starts about fifteen Python processes, all paying them at once).
Then the ``sitecustomize`` this file shadows, if there is one, runs as usual.

It also installs ``jsr_clientguard``: Ray Client's proxier sends a client's requests (with the
cluster token) only to the server it started for that client, on a port nobody else can take
(see there); and ``jsr_metrics``: Ray's Prometheus endpoints stay closed unless the cluster's
``ray_metrics`` setting opens them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

import jsr_clientguard  # beside this file, first on sys.path
import jsr_deferred
import jsr_metrics


def _is_a_copy_of_this(path: str) -> bool:
    """The directory holds this file's copy: another cluster's (a cluster started from a
    process of another one has both on PYTHONPATH), or this one. Its guard's module marks it."""
    return os.path.isfile(os.path.join(path or os.curdir, "jsr_clientguard.py"))


def _run_shadowed_sitecustomize() -> None:
    """The first ``sitecustomize`` on sys.path that is not a copy of this one: running
    another copy would run this again, which would look for the next one (endlessly)."""
    others = [p for p in sys.path if not _is_a_copy_of_this(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


jsr_deferred.install()
jsr_clientguard.install()
jsr_metrics.install()
_run_shadowed_sitecustomize()
