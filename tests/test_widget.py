"""The ClusterPanel widget model against the real testbed, and the notebook reprs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

import jupyter_slurm_ray
from jupyter_slurm_ray.config import SlurmRay
from jupyter_slurm_ray.formatting import format_duration, status_line
from jupyter_slurm_ray.live import StatusView
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.reprs import cluster_mimebundle
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.states import State, Status
from jupyter_slurm_ray.widget import ClusterPanel

from .clusters import wait_for
from .site_helpers import configured_site, jobs_named

ORDER = ["SUBMITTING", "PENDING", "STARTING", "READY", "CONNECTED", "STOPPING", "STOPPED"]


@pytest.fixture(scope="module")
def session(tmp_path_factory, testbed) -> Iterator[Session]:
    with configured_site(tmp_path_factory.mktemp("site")):
        yield Session(SlurmRay(default_profile="testbed"))


@pytest.fixture
def panel(session: Session) -> Iterator[ClusterPanel]:
    panel = ClusterPanel(session=session)
    yield panel
    panel.close()


# -- reprs (no cluster needed) ----------------------------------------------------------------
def test_durations_read_like_slurm():
    assert format_duration(3725) == "1:02:05"
    assert format_duration(2 * 86400 + 5) == "2-00:00:05"
    assert format_duration(None) == "?"


def test_a_status_line_has_reason_start_estimate_elapsed_and_time_left():
    from datetime import datetime

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


def test_a_cluster_has_a_text_and_html_repr():
    from jupyter_slurm_ray.cluster import SlurmRayCluster

    cluster = SlurmRayCluster(ClusterSpec(name="demo", nodes=2, time="1:00:00", gpus_per_node=1))
    bundle = cluster_mimebundle(cluster)
    assert bundle["text/plain"].startswith("SlurmRayCluster demo\n")
    assert "2 × default CPU, 1 GPU per node, walltime 01:00:00" in bundle["text/plain"]
    assert "<table" in bundle["text/html"] and ">SUBMITTING</span>" in bundle["text/html"]


# -- the form ---------------------------------------------------------------------------------
def test_the_partition_dropdown_comes_from_sinfo_with_idle_total_and_max_time(panel):
    labels = dict((value, label) for label, value in panel.partition.options)
    assert set(labels) >= {"", "debug", "short"}
    assert labels["short"].startswith("short — ") and "max 00:30:00" in labels["short"]
    assert "/3 idle" in labels["debug"] and "max unlimited" in labels["debug"]
    assert "2 GPU" in labels["debug"]


def test_the_form_starts_from_the_default_profile_and_follows_the_chosen_one(panel):
    assert panel.profile.value == "testbed"
    assert (panel.nodes.value, panel.cpus.value, panel.gpus.value) == (1, 1, 0)
    assert panel.walltime.value == "00:10:00"
    panel.profile.value = "gpu-small"
    assert panel.gpus.value == 1
    assert panel.spec().gpus_per_node == 1


def test_a_bad_field_is_one_line_in_the_panel_and_submits_nothing(panel):
    name = "w" + uuid.uuid4().hex[:8]
    panel.name.value = name
    panel.walltime.value = "25:99"
    panel.up_button.click()
    assert "time: '25:99' is not allowed" in panel.message.value
    assert "\n" not in panel.message.value
    assert panel.cluster is None and jobs_named(name) == []
    panel.walltime.value = "10"
    panel.nodes.value = 4
    panel.up_button.click()
    assert "nodes: 4 is not allowed; at most 3 in partition" in panel.message.value
    assert jobs_named(name) == []


def test_panel_opens_from_the_package():
    opened = jupyter_slurm_ray.panel(session=Session(SlurmRay()))
    try:
        assert isinstance(opened, ClusterPanel)
    finally:
        opened.close()


# -- a real cluster, driven by the buttons ----------------------------------------------------
def test_up_shows_each_state_in_order_until_connected_then_stop(panel, session):
    import ray

    name = "w" + uuid.uuid4().hex[:8]
    panel.name.value = name
    started = time.monotonic()
    panel.up_button.click()
    try:
        assert panel.up_button.disabled and not panel.stop_button.disabled
        view: StatusView = panel.status_view
        wait_for(lambda: view.state in ("CONNECTED", "FAILED"), 180, "CONNECTED")
        up_seconds = time.monotonic() - started
        assert view.state == "CONNECTED", panel.message.value
        assert view.history == [s for s in ORDER if s in view.history]
        assert {"PENDING", "STARTING", "CONNECTED"} <= set(view.history)
        assert (view.progress.value, view.progress.max) == (1, 1)
        assert "Ray dashboard: <a href=" in view.link.value
        assert "CONNECTED · job " in view.line.value and " left" in view.line.value
        wait_for(lambda: "ready" in panel.log_tail.value, 10, "the log tail")
        assert ray.get(ray.remote(lambda: "from the panel").remote()) == "from the panel"
        assert session.current is panel.cluster
        assert panel.connect_button.disabled  # already connected
    finally:
        stopped = time.monotonic()
        panel.stop_button.click()
        wait_for(lambda: panel.status_view.state in ("STOPPED", "FAILED"), 90, "STOPPED")
    assert panel.status_view.history[-2:] == ["STOPPING", "STOPPED"]
    assert not panel.up_button.disabled and panel.stop_button.disabled
    assert not ray.is_initialized()
    record = Registry().find(name)
    assert record is not None and record.state == "STOPPED"
    stop_seconds = time.monotonic() - stopped
    print(f"\npanel Up → CONNECTED {up_seconds:.1f} s, Stop → STOPPED {stop_seconds:.1f} s")
    first = panel.cluster.history[0].at
    print(", ".join(f"{s.state}@{s.at - first:.1f}" for s in panel.cluster.history))
