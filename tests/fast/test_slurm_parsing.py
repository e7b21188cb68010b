"""Parsing what Slurm prints: pure functions, no Slurm needed."""

from __future__ import annotations

from datetime import datetime

import pytest

from jupyter_slurm_ray.errors import SlurmError
from jupyter_slurm_ray.slurm.client import _job_id
from jupyter_slurm_ray.slurm.formats import expand_hostlist, parse_exit_code
from jupyter_slurm_ray.slurm.output import (
    parse_sacct,
    parse_scontrol_job,
    parse_sinfo,
    parse_squeue_line,
)
from jupyter_slurm_ray.spec.units import parse_duration


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,7],gpu01", ["node1", "node2", "node7", "gpu01"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("59:58", 59 * 60 + 58),
        ("1:00:00", 3600),
        ("1-00:00:00", 86400),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("0:00", 0),
        ("525600", 525600 * 60),
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "code"), [("0:0", 0), ("3:0", 3), ("0:15", 143), ("0:9", 137), ("", None)]
)
def test_parse_exit_code(text, code):
    assert parse_exit_code(text) == code


def test_squeue_line_of_a_pending_job_keeps_reason_and_estimate():
    info = parse_squeue_line(
        "42|PENDING|4|2026-11-29T20:00:00|1:00:00|1:00:00||ray|jupyter-slurm-ray:abcd-0001|"
        "PartitionNodeLimit"
    )
    assert info is not None
    assert (info.job_id, info.state, info.reason) == ("42", "PENDING", "PartitionNodeLimit")
    assert info.comment == "jupyter-slurm-ray:abcd-0001"
    assert info.start_time == datetime(2026, 11, 29, 20, 0, 0)
    assert info.nodes == () and info.node_count == 4 and info.is_pending


def test_squeue_line_of_a_running_job_expands_nodes():
    info = parse_squeue_line(
        "7|RUNNING|2|2026-11-29T19:00:00|59:10|1:00:00|node[1-2]|ray|(null)|None"
    )
    assert info is not None and info.comment == ""
    assert info.nodes == ("node1", "node2") and info.reason is None
    assert info.time_left == 59 * 60 + 10 and info.time_limit == 3600 and info.is_running


def test_sacct_keeps_allocation_lines_and_exit_codes():
    out = (
        "12|COMPLETED|0:0|node[1-2]|2026-11-29T19:00:00|01:00:00|ray\n"
        "12.batch|COMPLETED|0:0|node1|2026-11-29T19:00:00||batch\n"
        "13|CANCELLED by 1000|0:15|node3|2026-11-29T19:00:00|01:00:00|ray\n"
    )
    infos = parse_sacct(out)
    assert set(infos) == {"12", "13"}
    assert infos["12"].exit_code == 0 and infos["12"].nodes == ("node1", "node2")
    assert infos["13"].state == "CANCELLED" and infos["13"].exit_code == 143


def test_sinfo_merges_lines_of_one_partition():
    out = (
        "debug|up|0/2/0/2|2|8000|gpu:2|infinite|debug*\n"
        "debug|up|1/0/0/1|2|8000|gpu:2|infinite|debug*\n"
        "short|up|0/3/0/3|2|8000|(null)|30:00|short\n"
    )
    debug, short = parse_sinfo(out)
    assert (debug.name, debug.idle_nodes, debug.total_nodes, debug.is_default) == (
        "debug",
        2,
        3,
        True,
    )
    assert debug.gpus_per_node == 2 and debug.max_time is None
    assert (short.max_time, short.gres, short.is_default) == (1800, (), False)


@pytest.mark.parametrize("bad", ["1;rm", "$(id)", "", "12 13", "-1"])
def test_job_ids_are_checked_before_reaching_a_command(bad):
    with pytest.raises(SlurmError, match="not a Slurm job id"):
        _job_id(bad)


def test_scontrol_show_job_line():
    line = (
        "JobId=5 JobName=ray UserId=alice(1001) JobState=FAILED Reason=NonZeroExitCode "
        "ExitCode=3:0 TimeLimit=00:05:00 StartTime=2026-11-29T19:05:04 NodeList=node[1-2]"
    )
    info = parse_scontrol_job(line)
    assert info is not None
    assert (info.job_id, info.state, info.exit_code, info.nodes) == (
        "5",
        "FAILED",
        3,
        ("node1", "node2"),
    )
    assert info.time_limit == 300 and parse_scontrol_job("garbage") is None
