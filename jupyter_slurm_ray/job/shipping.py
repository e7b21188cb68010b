"""The bootstrap program's files, as the client copies them into a job dir's ``bootstrap/``."""

from __future__ import annotations

from importlib import resources

from ..bootstrap.jsr_wire import SITE_PATH


def bootstrap_files() -> dict[str, str]:
    """Relative name -> text of every ``*.py`` of the ``bootstrap`` directory (and of its
    ``sitepath/``), sorted by name.

    The job runs ``python JOB_DIR/bootstrap ...``: Python runs its ``__main__.py`` with the
    directory first on ``sys.path``, so its modules import each other as top-level modules.
    """
    package = resources.files("jupyter_slurm_ray").joinpath("bootstrap")
    files = {item.name: item for item in package.iterdir() if item.name.endswith(".py")}
    site = package.joinpath(SITE_PATH)
    files.update(
        {f"{SITE_PATH}/{item.name}": item for item in site.iterdir() if item.name.endswith(".py")}
    )
    return {name: files[name].read_text() for name in sorted(files)}
