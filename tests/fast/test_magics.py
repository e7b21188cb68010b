"""``%slurm_ray``'s command line, and the subcommands that submit nothing, in a real IPython shell
on a scripted Slurm: parsing, ``--help``, refused requests in one line, ``config``, ``script``.

Starting clusters from the magics is tested on the real testbed (tests/test_magics.py).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.ui.magic_args import SUBCOMMANDS, ArgumentError, HelpRequested, parse

from ..helpers.fakeslurm import FakeSlurm
from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import MagicShell, one_line_error


# -- the command line alone -------------------------------------------------------------------
def test_a_line_parses_into_the_subcommand_and_its_options():
    args = parse("up -N 2 -p debug -t 1:00:00 -G 1 --name demo --detach --setup 'module load x'")
    assert (args.command, args.nodes, args.partition, args.time) == ("up", "2", "debug", "1:00:00")
    assert (args.gpus_per_node, args.name, args.detach) == ("1", "demo", True)
    assert args.setup == ["module load x"]
    assert parse("down --all").all and parse("logs ray --tail 5").tail == 5


def test_a_comment_after_the_line_is_ignored_and_a_quoted_hash_is_kept():
    args = parse("up -N 2 -t 10  # ten minutes, two nodes")
    assert (args.command, args.nodes, args.time) == ("up", "2", "10")
    assert parse("up --setup 'echo #1' # the first").setup == ["echo #1"]


@pytest.mark.parametrize("line", ["", "--help", "up --help", "config -h"])
def test_help_is_raised_with_the_text_never_printed_nor_exiting(line):
    with pytest.raises(HelpRequested) as shown:
        parse(line)
    assert str(shown.value).startswith("usage: %slurm_ray")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("up --frobnicate", "%slurm_ray up: unrecognized arguments: --frobnicate"),
        ("launch", "%slurm_ray: argument COMMAND: invalid choice: 'launch'"),
        ("logs --tail lots", "%slurm_ray logs: argument --tail: invalid int value: 'lots'"),
        ("attach", "%slurm_ray attach: the following arguments are required: name"),
        ("up --name 'unclosed", "%slurm_ray: cannot split the line: No closing quotation"),
    ],
)
def test_a_bad_line_is_one_line_naming_the_subcommand(line, message):
    with pytest.raises(ArgumentError) as refused:
        parse(line)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_only_up_takes_a_cell_body():
    assert parse("up -N 1", cell=True).command == "up"
    with pytest.raises(ArgumentError, match=r"only `%%slurm_ray up …` takes a cell body"):
        parse("status", cell=True)


# -- in an IPython shell ----------------------------------------------------------------------
@pytest.fixture
def ipython(ipython_shell) -> InteractiveShell:
    return ipython_shell


@pytest.fixture
def run(magic: MagicShell):
    return magic.run


@pytest.fixture
def name() -> str:
    return "m" + uuid.uuid4().hex[:8]


def nothing_submitted(slurm: FakeSlurm, name: str) -> bool:
    return (
        slurm.jobs == {}
        and not [call for call in slurm.calls if call[0] == "sbatch"]
        and not [r for r in Registry().all() if r.name == name]
    )


def test_load_ext_registers_the_magic(ipython, site):
    ipython.run_line_magic("load_ext", "jupyter_slurm_ray")
    assert "slurm_ray" in ipython.magics_manager.magics["line"]
    assert "slurm_ray" in ipython.magics_manager.magics["cell"]


@pytest.mark.parametrize("command", ["", *SUBCOMMANDS])
def test_every_subcommand_has_help(run, command):
    out, err, error = run(f"%slurm_ray {command} --help")
    assert error is None and not err
    assert out.startswith(f"usage: %slurm_ray {command}".rstrip())


def test_no_arguments_show_the_commands(run):
    out, _, error = run("%slurm_ray")
    assert error is None
    assert all(command in out for command in SUBCOMMANDS)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("--frobnicate", "%slurm_ray up: unrecognized arguments: --frobnicate"),
        ("-N 0", "nodes: '0' is not allowed; a whole number from 1"),
        ("-t 25:99", "time: '25:99' is not allowed; a Slurm walltime like"),
        ("--profile gpu-huge", "profile: 'gpu-huge' is not allowed; a profile defined in"),
        ("-p nowhere", "partition: 'nowhere' is not allowed; a partition of this cluster: debug"),
        ("-p short -t 1:00:00", "time: '01:00:00' is not allowed; at most 00:30:00 in partition"),
        ("-N 4", "nodes: 4 is not allowed; at most 3 in partition"),
    ],
)
def test_a_bad_request_is_one_line_and_submits_nothing(run, slurm, name, options, expected):
    _, err, error = run(f"%slurm_ray up --name {name} {options}")
    assert expected in one_line_error(err)
    assert error is not None
    assert nothing_submitted(slurm, name)


def test_a_cell_body_is_for_up_only(run, slurm):
    _, err, error = run("%%slurm_ray status\nmodule load ray\n")
    assert "only `%%slurm_ray up …` takes a cell body" in one_line_error(err)
    assert error is not None and slurm.calls == []


def test_a_malformed_profiles_file_is_one_line_and_submits_nothing(
    run, slurm, name, tmp_path: Path, monkeypatch
):
    bad = tmp_path / "profiles.toml"
    bad.write_text("[profiles.testbed\nnodes = 1\n")
    monkeypatch.setenv("JUPYTER_SLURM_RAY_PROFILES_FILE", str(bad))
    _, err, _ = run(f"%slurm_ray up --name {name}")
    line = one_line_error(err)
    assert f"profiles_file: '{bad}' is not allowed; valid TOML" in line
    assert nothing_submitted(slurm, name)


def test_a_missing_walltime_says_how_to_give_one(run, slurm, name):
    run('%config SlurmRay.default_profile = ""')
    _, err, _ = run(f"%slurm_ray up --name {name}")
    assert "a walltime is required: pass -t 1:00:00" in one_line_error(err)
    assert nothing_submitted(slurm, name)


def test_a_refused_submit_leaves_no_record_and_an_unknown_outcome_keeps_it_for_gc(
    run, slurm, transport, name
):
    """The cluster's own rule, the same behind every front door: nothing queued, nothing
    kept; sbatch's answer lost and Slurm silent about it, the record stays for ``gc``."""
    transport.hang_before = "sbatch"  # it never ran, as the lookup by tag finds
    _, err, _ = run(f"%slurm_ray up --name {name} --no-connect")
    assert "no job was queued" in one_line_error(err) and nothing_submitted(slurm, name)
    transport.hang_before, transport.hang_after = "squeue", "sbatch"  # queued, Slurm silent
    _, err, _ = run(f"%slurm_ray up --name {name} --no-connect")
    assert "no clear outcome" in one_line_error(err) and "its record is kept" in err
    (kept,) = [r for r in Registry().all() if r.name == name]
    assert kept.job_id is None and len(slurm.jobs) == 1  # gc finds the job by its tag


def test_config_shows_each_setting_and_its_source(run, slurm):
    run('%config SlurmRay.time = "2:00:00"')
    out, _, error = run("%slurm_ray config -N 2")
    assert error is None
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert rows["nodes"].endswith("argument")
    assert rows["time"].endswith("profile testbed")  # the profile beats the config
    assert rows["python"].endswith("profile testbed")
    assert rows["poll_interval"].endswith("env JUPYTER_SLURM_RAY_POLL_INTERVAL")
    assert rows["default_profile"].endswith("config SlurmRay.default_profile")
    assert rows["account"].endswith("default")
    assert "gpu-small, testbed" in out
    assert slurm.calls == []  # config asks Slurm nothing


def test_percent_config_sets_a_setting(run, magic):
    run('%config SlurmRay.account = "proj9"')
    out, _, _ = run("%slurm_ray config")
    assert magic.magics.settings.account == "proj9"
    assert re.search(r"^account\s+'proj9'\s+config SlurmRay.account$", out, re.M)


def test_script_shows_the_job_script_and_submits_nothing(run, slurm, name):
    out, _, error = run(f"%slurm_ray script -N 2 -t 5 -G 1 --name {name} --setup 'echo hi'")
    assert error is None
    assert out.startswith("#!/bin/bash\n")
    for line in ("--nodes=2", "--time=00:05:00", "--gpus-per-node=1", f"--job-name={name}"):
        assert f"#SBATCH {line}" in out
    assert "echo hi" in out
    assert nothing_submitted(slurm, name)


def test_percent_config_of_the_leases_former_name_sets_owner_timeout(run, magic):
    with pytest.warns(DeprecationWarning, match="SlurmRay.owner_timeout"):
        run("%config SlurmRay.idle_timeout = 60")
    out, _, _ = run("%slurm_ray config")
    assert magic.magics.settings.owner_timeout == 60
    assert re.search(r"^owner_timeout\s+60\.0\s+config SlurmRay.owner_timeout$", out, re.M)
