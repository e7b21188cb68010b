"""The ``%slurm_ray`` magics in a real IPython shell, for fast tests of what the magics print."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from jupyter_slurm_ray import session as session_module
from jupyter_slurm_ray.ui.magics import SlurmRayMagics

__all__ = ["ipython_shell", "magic"]  # the fixtures, for `import *` in test modules


class MagicShell:
    """The shell with the magics of a fresh kernel session; ``run`` returns (stdout, stderr,
    the error the cell raised)."""

    def __init__(self, ip: InteractiveShell, capsys) -> None:
        self.ip, self.capsys = ip, capsys
        self.magics = SlurmRayMagics(ip)
        ip.register_magics(self.magics)

    def run(self, cell: str) -> tuple[str, str, BaseException | None]:
        self.capsys.readouterr()
        result = self.ip.run_cell(cell)
        out, err = self.capsys.readouterr()
        return out, err, result.error_in_exec


@pytest.fixture(scope="module")
def ipython_shell(tmp_path_factory) -> Iterator[InteractiveShell]:
    """One IPython shell per test module: no history file, its profile in a tmp dir."""
    config = Config({"HistoryManager": {"enabled": False}})
    shell = InteractiveShell.instance(config=config, ipython_dir=str(tmp_path_factory.mktemp("ip")))
    yield shell
    InteractiveShell.clear_instance()


@pytest.fixture
def magic(ipython_shell, site, capsys, monkeypatch) -> Iterator[MagicShell]:
    """The magics on the fake site (``site``), with the profile ``testbed`` as the default."""
    monkeypatch.setattr(session_module, "_session", None)  # a fresh kernel session
    shell = MagicShell(ipython_shell, capsys)
    shell.run('%config SlurmRay.default_profile = "testbed"')
    yield shell
    shell.run("%config SlurmRay.default_profile = None")
    ipython_shell.config.pop("SlurmRay", None)


def one_line_error(err: str) -> str:
    """The one ``UsageError`` line a refused magic prints (no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("UsageError: ")
    return lines[0]
