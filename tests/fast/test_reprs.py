"""What a notebook shows of a cluster: durations as Slurm prints them, the one-line status, the
text and HTML reprs, and the panel opened from the package (its form filled from Slurm)."""

from __future__ import annotations

from datetime import datetime

import jupyter_slurm_ray
from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SlurmRay
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State, Status
from jupyter_slurm_ray.ui.formatting import format_duration, status_line
from jupyter_slurm_ray.ui.reprs import cluster_mimebundle
from jupyter_slurm_ray.ui.widget import ClusterPanel


def test_durations_read_like_slurm():
    assert format_duration(3725) == "1:02:05"
    assert format_duration(2 * 86400 + 5) == "2-00:00:05"
    assert format_duration(None) == "?"


def test_a_status_line_has_reason_start_estimate_elapsed_and_time_left():
    pending = Status(
        State.PENDING,
        at=100.0,
        reason="Resources",
        job_id="7",
        estimated_start=datetime(2030, 1, 2, 3, 4),
    )
    assert status_line(pending, since=40.0, now=100.0) == (
        "PENDING · (Resources) · job 7 · est. start 2030-01-02 03:04 · elapsed 0:01:00"
    )
    up = Status(State.CONNECTED, at=100.0, job_id="7", time_left=600)
    assert status_line(up, now=160.0).endswith("0:09:00 left")


def test_a_cluster_has_a_text_and_html_repr(site):
    cluster = SlurmRayCluster(ClusterSpec(name="demo", nodes=2, time="1:00:00", gpus_per_node=1))
    bundle = cluster_mimebundle(cluster)
    assert bundle["text/plain"].startswith("SlurmRayCluster demo\n")
    assert "2 × default CPU, 1 GPU per node, walltime 01:00:00" in bundle["text/plain"]
    assert "<table" in bundle["text/html"] and ">SUBMITTING</span>" in bundle["text/html"]


def test_panel_opens_from_the_package(site, slurm):
    opened = jupyter_slurm_ray.panel(session=Session(SlurmRay()))
    try:
        assert isinstance(opened, ClusterPanel)
        assert [value for _, value in opened.partition.options] == ["", "debug", "short"]
    finally:
        opened.close()
    assert slurm.jobs == {}
