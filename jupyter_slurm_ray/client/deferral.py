"""Imports Ray pays for and rarely uses, deferred (``bootstrap/sitepath/jsr_deferred.py``,
which the cluster's Ray processes run from their ``sitecustomize``): by the kernel before it
imports ray, and in every Python process of the project's venv by a ``.pth`` line
(scripts/setup), Jupyter Server's among them. About 0.9 s of CPU less in each."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

from ..bootstrap.jsr_wire import SITE_PATH

log = logging.getLogger(__name__)

MODULE = "jsr_deferred"  # the name it has in the cluster's processes, where it is on sys.path
SOURCE = Path(__file__).resolve().parent.parent / "bootstrap" / SITE_PATH / f"{MODULE}.py"


def defer_costly_imports() -> None:
    """From now on in this process (once; a no-op when they are imported already)."""
    module = sys.modules.get(MODULE)
    if module is None:
        spec = importlib.util.spec_from_file_location(MODULE, SOURCE)
        if spec is None or spec.loader is None:
            log.debug("no %s at %s", MODULE, SOURCE)
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[MODULE] = module
    module.install()


def pth_line(source: Path = SOURCE) -> str:
    """The line of a ``.pth`` file that defers them in every Python process of an environment:
    the module loaded by its path, without importing this package (a process of the venv that
    never uses it pays nothing more); nothing when the file is gone."""
    return (
        "import os, sys, importlib.util as u; "
        f"p = {str(source)!r}; "
        f"s = {MODULE!r} not in sys.modules and os.path.isfile(p) "
        f"and u.spec_from_file_location({MODULE!r}, p); "
        "m = s and u.module_from_spec(s); "
        f"m and (s.loader.exec_module(m), sys.modules.setdefault({MODULE!r}, m).install())\n"
    )


if __name__ == "__main__":  # scripts/setup: python -m jupyter_slurm_ray.client.deferral
    sys.stdout.write(pth_line())
