"""The ClusterPanel widget model against the real testbed (the reprs and formatting are tested
in tests/fast/test_reprs.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from jupyter_slurm_ray.config import SlurmRay
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.ui.live import StatusView
from jupyter_slurm_ray.ui.widget import ClusterPanel

from .helpers.jobs import jobs_named
from .helpers.site import configured_site
from .helpers.waiting import wait_for

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
