"""The walltime people notice, in JupyterLab under headless Chromium: a cluster with a two-minute
walltime (warned 60 s before the end) gets ONE notification naming it and its time left, before
Slurm ends it with TIMEOUT; the sidebar marks it, the REST API says ``walltime_warning``, and the
kernel-side live view prints one line. Its Extend action shows Slurm's refusal (the testbed's
default policy), and the sidebar's Details view shows the cluster's usage.

JupyterLab runs as ``python -m jupyterlab`` with a token and a temporary settings dir; the cluster
is started from Python as the testbed user (a stand-in for a notebook) once the page is loaded,
so its two minutes are spent in front of the page.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.transport import LocalTransport
from jupyter_slurm_ray.ui.live import Notices
from tests.helpers.clusters import cluster_spec
from tests.helpers.jobs import queue_state
from tests.helpers.server import JupyterServer, jupyter_lab
from tests.helpers.sidebar import click_on_card
from tests.helpers.testbed import runuser
from tests.helpers.waiting import wait_for


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("walltime-lab")


@pytest.fixture(scope="module")
def lab(root, testbed_user) -> Iterator[JupyterServer]:
    with jupyter_lab(root, testbed_user) as server:
        yield server


@pytest.fixture(scope="module")
def page(browser: Browser, lab: JupyterServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    yield page
    context.close()


@pytest.fixture(scope="module")
def short_cluster(root, testbed_user, page) -> Iterator[tuple[SlurmRayCluster, list[str]]]:
    """A READY cluster with a 2-minute walltime, warned 60 s before its end; the lines its
    live view would print in a notebook."""
    cluster = SlurmRayCluster(
        cluster_spec(name="walltest", nodes=1, time="2", walltime_warning=60),
        LocalTransport(runuser(testbed_user)),
        registry=Registry(root / "state"),
    )
    printed: list[str] = []
    notices = Notices(cluster, printed.append)
    try:
        cluster.up(connect=False)
        yield cluster, printed
    finally:
        notices.close()
        cluster.down()


def card(page: Page, cluster_id: str):
    return page.locator(f'.jp-SlurmRay-cluster[data-cluster-id="{cluster_id}"]')


def test_the_walltime_warning_is_one_notification_before_timeout(
    page, lab, short_cluster, artifacts
):
    cluster, printed = short_cluster
    toast = page.locator(".Toastify__toast").filter(has_text="the walltime of walltest")
    expect(toast).to_have_count(1, timeout=150_000)
    state = queue_state(cluster.job_id)
    assert state == "RUNNING", f"the notification came after the job ended ({state!r})"
    text = toast.inner_text()
    assert re.search(rf"walltest \(job {cluster.job_id}\) is almost over: 0:0[01]:\d\d left", text)
    expect(toast.get_by_role("button", name="Extend…")).to_be_visible()
    tab = page.locator('.lm-TabBar-tab[data-id="jp-SlurmRay-sidebar"]')
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    expect(card(page, cluster.id).locator(".jp-SlurmRay-walltimeWarning")).to_be_visible()
    page.wait_for_timeout(1000)  # the toast's slide-in, for the screenshot
    page.screenshot(path=str(artifacts / "walltime-notification.png"))
    views = lab.get("slurm-ray/api/clusters").json()["clusters"]
    (view,) = [v for v in views if v["id"] == cluster.id]
    assert view["walltime_warning"] is True and view["time_left"] <= 120
    page.wait_for_timeout(12_000)  # two more listings: still one notification for it
    expect(toast).to_have_count(1)
    lines = wait_for(lambda: printed, 90, "the live view's walltime line")
    assert len([line for line in lines if "walltime almost over" in line]) == 1, lines


def test_extend_from_the_notification_shows_slurms_refusal(page, short_cluster, artifacts):
    """The testbed's default policy: users may not raise their own time limit."""
    cluster, _ = short_cluster
    toast = page.locator(".Toastify__toast").filter(has_text="the walltime of walltest")
    toast.get_by_role("button", name="Extend…").click()
    asked = page.locator(".jp-Dialog").filter(has_text="Extend the walltime of walltest")
    expect(asked.locator("input")).to_have_value("+30")
    asked.locator(".jp-mod-accept").click()
    refused = page.locator(".jp-Dialog").filter(has_text="Slurm refused to extend the walltime")
    expect(refused).to_contain_text(f"Access/permission denied for job {cluster.job_id}")
    expect(refused).to_contain_text("ask an operator or your site's support")
    page.screenshot(path=str(artifacts / "walltime-extend-refused.png"))
    refused.get_by_role("button", name="Close").click()
    expect(refused).to_have_count(0)


def test_the_details_view_shows_the_usage(page, short_cluster, artifacts):
    """(Slurm may have ended the cluster by now: its usage is shown either way.)"""
    cluster, _ = short_cluster
    item = card(page, cluster.id)
    click_on_card(page, cluster.id, "Details")  # its card may be folded by now (ended)
    details = page.locator(".jp-SlurmRay-details").last
    expect(details).to_contain_text(f"walltest ({cluster.id}), job {cluster.job_id}")
    expect(details).to_contain_text("CPU-hours allocated")
    expect(details).to_contain_text("CPU efficiency")
    expect(item.locator('[data-fact="usage"]')).to_contain_text("CPU-h", timeout=30_000)
    page.screenshot(path=str(artifacts / "walltime-details.png"))
