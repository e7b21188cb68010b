"""``jupyter slurm-ray``: reachable as a Jupyter subcommand, and its errors are one line with
status 1. (Its commands against a real Slurm are in tests/test_cli.py.)"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from jupyter_slurm_ray.ui.cli import main

pytestmark = pytest.mark.usefixtures("root_logging_kept")


def test_the_command_is_reachable_as_jupyter_subcommand():
    jupyter = Path(sys.executable).with_name("jupyter")
    result = subprocess.run([jupyter, "slurm-ray", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("list", "down", "logs", "gc"):
        assert command in result.stdout


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"jupyter slurm-ray {version('jupyter-slurm-ray')}\n"


def test_errors_are_one_line_with_status_1(site, slurm, capsys):
    assert main(["logs", "no-such-cluster"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("jupyter slurm-ray: error: no cluster 'no-such-cluster'")
    assert err.count("\n") == 1
    assert main(["down"]) == 1
    assert "give a cluster NAME or --all" in capsys.readouterr().err
    assert slurm.calls == []
