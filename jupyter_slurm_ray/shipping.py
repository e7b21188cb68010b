"""The bootstrap program's files, as the client copies them into a job dir's ``bootstrap/``."""

from __future__ import annotations

from importlib import resources


def bootstrap_files() -> dict[str, str]:
    """File name -> text of every ``*.py`` of the ``bootstrap`` directory, sorted by name.

    The job runs ``python JOB_DIR/bootstrap ...``: Python runs its ``__main__.py`` with the
    directory first on ``sys.path``, so its modules import each other as top-level modules.
    """
    package = resources.files("jupyter_slurm_ray").joinpath("bootstrap")
    files = sorted((item.name, item) for item in package.iterdir() if item.name.endswith(".py"))
    return {name: item.read_text() for name, item in files}
